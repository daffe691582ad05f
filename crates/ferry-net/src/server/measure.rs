//! The server's side of a speed test (`ferry probe net`, [`crate::speedtest`]): the request
//! checked and bounded, the data connections gathered as for a transfer, filler sent or
//! counted, the result sent.

use std::time::Duration;

use ferry_proto::{ChecksumAlgo, ErrorCode, ExistingPolicy, Frame, ProbeDirection, TransferOpts};
use tokio::time::Instant;

use super::access::Grant;
use super::registry::{gather, Named};
use super::state::ServerState;
use crate::error::SessionError;
use crate::speedtest::flow::{
    run_streams, Buckets, DRAIN_GRACE, MAX_PROBE_DURATION, MIN_PROBE_DURATION, PROBE_FRAME_DATA,
    PROBE_INTERVAL,
};
use crate::transport::conn::send;
use crate::transport::stream::Stream;

/// The server's side, called from `prepare` for a `ProbeRequest`: checks and bounds it, lets
/// the data connections join, runs the probe and sends `ProbeResult`.
pub(super) async fn serve(
    shared: &ServerState,
    control: &mut Stream,
    grant: &Grant,
    named: Named,
    request: Frame,
) -> Result<(), SessionError> {
    let Frame::ProbeRequest {
        direction,
        streams,
        duration_ms,
        window,
    } = request
    else {
        return Err(SessionError::Protocol("expected ProbeRequest".into()));
    };
    if !grant.may_read_something() {
        return Err(SessionError::Remote {
            code: ErrorCode::DENIED,
            message: format!(
                "permission denied: token `{}` has no read scope, which a probe needs",
                grant.name
            ),
        });
    }
    let duration = Duration::from_millis(u64::from(duration_ms));
    if !(MIN_PROBE_DURATION..=MAX_PROBE_DURATION).contains(&duration) {
        return Err(SessionError::Remote {
            code: ErrorCode::BAD_REQUEST,
            message: format!(
                "a probe runs {} ms to {} s, not {duration_ms} ms",
                MIN_PROBE_DURATION.as_millis(),
                MAX_PROBE_DURATION.as_secs()
            ),
        });
    }
    let opts = TransferOpts {
        streams: streams.clamp(1, shared.config.max_streams.max(1)),
        block_size: PROBE_FRAME_DATA,
        checksum: ChecksumAlgo::Blake3,
        existing: ExistingPolicy::Fail,
        tcp_window: window,
        auto_start: 0,
        storage_threads: 0,
    };
    // Data connections hold connection-cap permits for as long as they are open.
    let (data, _permits, _registered) =
        gather(&shared.registry, control, named, &opts, None).await?;
    let buckets = Buckets::new(Instant::now(), duration + DRAIN_GRACE);
    let sending = direction == ProbeDirection::ServerToClient;
    let streams = run_streams(data, sending, &buckets, duration).await?;
    tracing::info!(
        streams = streams.len(),
        bytes = streams.iter().map(|s| s.bytes).sum::<u64>(),
        ?direction,
        "probe complete"
    );
    send(
        control,
        &Frame::ProbeResult {
            interval_ms: PROBE_INTERVAL.as_millis() as u16,
            intervals: buckets.snapshot(),
            streams,
        },
    )
    .await?;
    Ok(())
}
