//! Codec tests through the public API only, as a driver or a peer would use it.

use bytes::{Bytes, BytesMut};
use ferry_proto::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn encode(frame: &Frame) -> BytesMut {
    let mut out = BytesMut::new();
    frame.encode(&mut out);
    out
}

/// Splits an encoded frame the way a driver does: header first, then exactly `len` bytes.
fn decode(mut encoded: BytesMut) -> Result<Frame, DecodeError> {
    let payload = encoded.split_off(HEADER_LEN).freeze();
    let header: [u8; HEADER_LEN] = encoded[..].try_into().expect("header is 5 bytes");
    let header = FrameHeader::parse(&header)?;
    assert_eq!(
        header.len as usize,
        payload.len(),
        "header length must match the payload"
    );
    Frame::decode(header.ty, payload)
}

fn payload_of(frame: &Frame) -> Bytes {
    encode(frame).split_off(HEADER_LEN).freeze()
}

// ---------------------------------------------------------------------------------------------
// Strategies: valid values only, i.e. within every limit the decoder enforces.

/// Any chars, control and non-ASCII included; 64 chars are at most 256 bytes, within every
/// string limit (the smallest is `MAX_TOKEN` = 256). Exact limits are tested separately.
fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..64).prop_map(String::from_iter)
}

fn opts() -> impl Strategy<Value = TransferOpts> {
    (
        1..=MAX_STREAMS,
        MIN_BLOCK_SIZE..=MAX_BLOCK_DATA,
        prop_oneof![
            Just(ChecksumAlgo::Blake3),
            Just(ChecksumAlgo::Xxh3),
            Just(ChecksumAlgo::Sha256),
            Just(ChecksumAlgo::Md5),
        ],
        prop_oneof![
            Just(ExistingPolicy::Fail),
            Just(ExistingPolicy::Overwrite),
            Just(ExistingPolicy::Skip),
        ],
        any::<u32>(),
        0..=MAX_STREAMS,
        0..=MAX_STORAGE_THREADS,
    )
        .prop_map(
            |(streams, block_size, checksum, existing, tcp_window, auto_start, storage_threads)| {
                TransferOpts {
                    streams,
                    block_size,
                    checksum,
                    existing,
                    tcp_window,
                    auto_start,
                    storage_threads,
                }
            },
        )
}

fn load() -> impl Strategy<Value = Load> {
    any::<[u16; 4]>().prop_map(|[cpu, starved, blocked, threads]| Load {
        cpu_permille: cpu,
        starved_permille: starved,
        blocked_permille: blocked,
        threads,
    })
}

fn tune_report() -> impl Strategy<Value = TuneReport> {
    let step = (
        any::<u32>(),
        any::<u16>(),
        any::<u64>(),
        any::<u16>(),
        prop_oneof![
            Just(TuneVerdict::Baseline),
            Just(TuneVerdict::Kept),
            Just(TuneVerdict::Rejected),
            Just(TuneVerdict::Drift),
        ],
    )
        .prop_map(|(at_ms, streams, rate, noise_permille, verdict)| TuneStep {
            at_ms,
            streams,
            rate,
            noise_permille,
            verdict,
        });
    (
        any::<u16>(),
        any::<u16>(),
        0..=TuneReport::ALL,
        load(),
        vec(step, 0..=MAX_TUNE_STEPS),
    )
        .prop_map(|(streams, start, flags, sender, steps)| TuneReport {
            streams,
            start,
            flags,
            sender,
            steps,
        })
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        (text(), any::<u64>(), any::<[u8; 32]>()).prop_map(|(token, session, secret)| {
            Role::Control {
                token,
                session: SessionId(session),
                secret,
            }
        }),
        (any::<u64>(), any::<[u8; 32]>(), any::<u16>()).prop_map(|(session, secret, stream)| {
            Role::Data {
                session: SessionId(session),
                secret,
                stream,
            }
        }),
    ]
}

fn list_entry() -> impl Strategy<Value = ListEntry> {
    (
        text(),
        prop_oneof![
            Just(EntryKind::File),
            Just(EntryKind::Dir),
            Just(EntryKind::Symlink),
            Just(EntryKind::Other),
        ],
        any::<u64>(),
        any::<u32>(),
        any::<i64>(),
    )
        .prop_map(|(name, kind, size, mode, mtime_ns)| ListEntry {
            name,
            kind,
            size,
            mode,
            mtime_ns,
        })
}

/// Blocks that satisfy the decoder's consistency rules: the data lies within the file, and a
/// file digest only travels on the block that ends it.
fn block() -> impl Strategy<Value = Block> {
    (
        (any::<u64>(), text(), any::<u32>(), any::<i64>()),
        prop_oneof![Just(0), any::<u64>()],
        any::<u64>(),
        any::<u128>(),
        proptest::option::of(vec(any::<u8>(), 1..=MAX_DIGEST)),
        (any::<bool>(), vec(any::<u8>(), 0..600)),
    )
        .prop_map(
            |((id, path, mode, mtime_ns), offset, tail, digest, file_digest, (early, data))| {
                let len = data.len() as u64;
                let offset = offset.min(u64::MAX - len);
                let end = offset + len;
                let size = if file_digest.is_some() {
                    end
                } else {
                    end.saturating_add(tail % 4)
                };
                Block {
                    file: FileMeta {
                        id: FileId(id),
                        path,
                        size,
                        mode,
                        mtime_ns,
                    },
                    offset,
                    digest,
                    file_digest: file_digest.map(Bytes::from),
                    early,
                    data: Bytes::from(data),
                }
            },
        )
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u16>(), any::<u64>(), role())
            .prop_map(|(version, caps, role)| Frame::Hello {
                version,
                capabilities: Capabilities(caps),
                role
            })
            .boxed(),
        (any::<u16>(), any::<u64>(), any::<u64>(), any::<[u8; 32]>())
            .prop_map(|(version, caps, session, secret)| Frame::Welcome {
                version,
                capabilities: Capabilities(caps),
                session: SessionId(session),
                secret,
            })
            .boxed(),
        (any::<u16>(), text())
            .prop_map(|(code, message)| Frame::Error {
                code: ErrorCode(code),
                message
            })
            .boxed(),
        (text(), any::<u32>(), opts())
            .prop_map(|(dest, sources, opts)| Frame::PutRequest {
                dest,
                sources,
                opts
            })
            .boxed(),
        (text(), opts())
            .prop_map(|(src, opts)| Frame::GetRequest { src, opts })
            .boxed(),
        text().prop_map(|path| Frame::ListRequest { path }).boxed(),
        (1..=MAX_STREAMS, MIN_BLOCK_SIZE..=MAX_BLOCK_DATA)
            .prop_map(|(streams, block_size)| Frame::Ready {
                streams,
                block_size
            })
            .boxed(),
        vec(list_entry(), 0..8)
            .prop_map(|entries| Frame::ListEntries { entries })
            .boxed(),
        Just(Frame::ListEnd).boxed(),
        block().prop_map(Frame::Block).boxed(),
        (text(), any::<u32>(), any::<i64>())
            .prop_map(|(path, mode, mtime_ns)| Frame::Dir {
                path,
                mode,
                mtime_ns
            })
            .boxed(),
        (text(), text(), any::<i64>())
            .prop_map(|(path, target, mtime_ns)| Frame::Symlink {
                path,
                target,
                mtime_ns
            })
            .boxed(),
        any::<[u64; 4]>()
            .prop_map(|[files, dirs, symlinks, bytes]| Frame::Sent {
                files,
                dirs,
                symlinks,
                bytes
            })
            .boxed(),
        (any::<u64>(), any::<u64>(), any::<u32>())
            .prop_map(|(file, offset, len)| Frame::Resend {
                file: FileId(file),
                offset,
                len
            })
            .boxed(),
        any::<u64>()
            .prop_map(|file| Frame::Skipped { file: FileId(file) })
            .boxed(),
        (any::<u64>(), any::<u16>(), text())
            .prop_map(|(file, code, message)| Frame::FileFailed {
                file: FileId(file),
                code: ErrorCode(code),
                message,
            })
            .boxed(),
        (any::<[u64; 5]>(), load())
            .prop_map(|([files, bytes, skipped, failed, bad_blocks], receiver)| {
                Frame::Complete(CompleteSummary {
                    files,
                    bytes,
                    skipped,
                    failed,
                    bad_blocks,
                    receiver,
                })
            })
            .boxed(),
        tune_report().prop_map(Frame::Tuned).boxed(),
        vec(
            (
                any::<u64>(),
                text(),
                any::<u64>(),
                any::<u32>(),
                any::<i64>()
            )
                .prop_map(|(file, path, size, mode, mtime_ns)| OfferEntry {
                    file: FileId(file),
                    path,
                    size,
                    mode,
                    mtime_ns,
                }),
            0..20,
        )
        .prop_map(|entries| Frame::Offer { entries })
        .boxed(),
        vec(
            (any::<u64>(), decision()).prop_map(|(file, decision)| FileDecision {
                file: FileId(file),
                decision
            }),
            0..20,
        )
        .prop_map(|entries| Frame::Decisions { entries })
        .boxed(),
        (text(), any::<u16>(), text())
            .prop_map(|(path, code, message)| Frame::EntryFailed {
                path,
                code: ErrorCode(code),
                message
            })
            .boxed(),
        (any::<bool>(), 1..=MAX_STREAMS, any::<u32>(), any::<u32>())
            .prop_map(|(up, streams, duration_ms, window)| Frame::ProbeRequest {
                direction: if up {
                    ProbeDirection::ClientToServer
                } else {
                    ProbeDirection::ServerToClient
                },
                streams,
                duration_ms,
                window,
            })
            .boxed(),
        (
            1..=u16::MAX,
            vec(any::<u64>(), 0..64),
            vec(
                any::<(u64, [u32; 5])>().prop_map(|(bytes, [a, b, c, d, e])| ProbeStream {
                    bytes,
                    rtt_us: a,
                    min_rtt_us: b,
                    snd_cwnd: c,
                    snd_mss: d,
                    total_retrans: e,
                }),
                0..20
            ),
        )
            .prop_map(|(interval_ms, intervals, streams)| Frame::ProbeResult {
                interval_ms,
                intervals,
                streams,
            })
            .boxed(),
        vec(any::<u8>(), 0..600)
            .prop_map(|d| Frame::ProbeData {
                data: Bytes::from(d)
            })
            .boxed(),
        (text(), 0u8..3)
            .prop_map(|(dest, e)| Frame::GrantRequest {
                dest,
                existing: [
                    ExistingPolicy::Fail,
                    ExistingPolicy::Overwrite,
                    ExistingPolicy::Skip,
                ][usize::from(e)],
            })
            .boxed(),
        (text(), any::<u32>())
            .prop_map(|(grant, ttl_ms)| Frame::Granted { grant, ttl_ms })
            .boxed(),
        (
            (text(), text(), text()),
            any::<[u8; 32]>(),
            text(),
            opts(),
            (any::<bool>(), any::<bool>()),
            vec((text(), any::<[u8; 32]>(), text()), 0..4)
        )
            .prop_map(
                |((src, dest, peer), fingerprint, grant, opts, (only, pull), stripes)| {
                    Frame::CopyRequest(Box::new(CopyRequest {
                        src,
                        dest,
                        peer,
                        fingerprint,
                        grant,
                        opts,
                        only,
                        stripes: stripes
                            .into_iter()
                            .map(|(addr, fingerprint, grant)| CopyStripe {
                                addr,
                                fingerprint,
                                grant,
                            })
                            .collect(),
                        pull,
                    }))
                }
            )
            .boxed(),
        text()
            .prop_map(|dest| Frame::StripeGrantRequest { dest })
            .boxed(),
        (text(), any::<bool>())
            .prop_map(|(src, stripe)| Frame::ReadGrantRequest { src, stripe })
            .boxed(),
        (any::<[u64; 4]>(), any::<bool>())
            .prop_map(|([found_files, found_bytes, files, bytes], walk_done)| {
                Frame::CopyProgress(CopyProgress {
                    found_files,
                    found_bytes,
                    walk_done,
                    files,
                    bytes,
                })
            })
            .boxed(),
        (any::<[u64; 5]>(), load(), "[ -~]{0,300}")
            .prop_map(
                |([files, bytes, skipped, failed, bad_blocks], receiver, report)| {
                    Frame::CopyDone {
                        summary: CompleteSummary {
                            files,
                            bytes,
                            skipped,
                            failed,
                            bad_blocks,
                            receiver,
                        },
                        report,
                    }
                }
            )
            .boxed(),
        (text(), opts())
            .prop_map(|(dest, opts)| Frame::StripeRequest { dest, opts })
            .boxed(),
        (
            any::<u64>(),
            0u64..1 << 50,
            1..=MAX_BLOCK_DATA,
            any::<u128>(),
            vec(any::<[u8; 32]>(), 0..=MAX_LANDED_CVS)
        )
            .prop_map(|(file, offset, len, digest, cvs)| Frame::Landed {
                file: FileId(file),
                offset,
                len,
                digest,
                cvs,
            })
            .boxed(),
        (any::<u64>(), vec(any::<u8>(), 1..=MAX_DIGEST))
            .prop_map(|(file, digest)| Frame::FileDigest {
                file: FileId(file),
                digest: digest.into(),
            })
            .boxed(),
        (text(), opts())
            .prop_map(|(src, opts)| Frame::StripeRead { src, opts })
            .boxed(),
        (
            any::<u64>(),
            text(),
            0u64..1 << 50,
            any::<i64>(),
            0u64..1 << 50,
            1..=MAX_BLOCK_DATA
        )
            .prop_map(|(file, path, offset, mtime_ns, extra, len)| Frame::Fetch {
                file: FileId(file),
                path,
                size: offset + u64::from(len) + extra,
                mtime_ns,
                offset,
                len,
            })
            .boxed(),
        (vec(text(), 0..=MAX_REMOVE_PATHS), any::<bool>())
            .prop_map(|(paths, more)| Frame::RemoveRequest { paths, more })
            .boxed(),
        (
            0..=MAX_REMOVE_PATHS as u16,
            vec(
                (0..MAX_REMOVE_PATHS as u16, any::<u16>(), text()),
                0..=MAX_REMOVE_PATHS
            )
        )
            .prop_map(|(removed, failures)| Frame::Removed {
                removed,
                failures: failures
                    .into_iter()
                    .map(|(index, code, message)| RemoveFailure {
                        index,
                        code: ErrorCode(code),
                        message,
                    })
                    .collect(),
            })
            .boxed(),
        (vec(text(), 0..=64), any::<bool>())
            .prop_map(|(paths, more)| Frame::CopyPaths { paths, more })
            .boxed(),
        catalog_request().prop_map(Frame::CatalogRequest).boxed(),
        catalog_answer().prop_map(Frame::CatalogAnswer).boxed(),
        (vec(any::<u8>(), 0..600), any::<bool>())
            .prop_map(|(d, last)| Frame::TarData {
                data: Bytes::from(d),
                last
            })
            .boxed(),
    ]
}

fn meta_entry() -> impl Strategy<Value = MetaEntry> {
    (text(), text(), "[a-zA-Z]{0,8}").prop_map(|(attr, value, unit)| MetaEntry {
        attr,
        value,
        unit,
    })
}

fn find_request() -> impl Strategy<Value = FindRequest> {
    (
        text(),
        vec(
            (
                prop_oneof![Just(Compare::Eq), Just(Compare::Gt), Just(Compare::Lt)],
                text(),
                text(),
            ),
            0..=MAX_FIND_CONDITIONS,
        ),
        proptest::option::of(text()),
        proptest::option::of(any::<i64>()),
        proptest::option::of(any::<u64>()),
        1..=MAX_FIND_LIMIT,
    )
        .prop_map(
            |(under, conds, name, newer_ns, larger, limit)| FindRequest {
                under,
                conditions: conds
                    .into_iter()
                    .map(|(compare, attr, value)| FindCondition {
                        compare,
                        attr,
                        value,
                    })
                    .collect(),
                name,
                newer_ns,
                larger,
                limit,
            },
        )
}

fn catalog_request() -> impl Strategy<Value = CatalogRequest> {
    prop_oneof![
        text().prop_map(|path| CatalogRequest::Stat { path }),
        (text(), any::<bool>())
            .prop_map(|(path, recursive)| CatalogRequest::Remove { path, recursive }),
        (text(), text()).prop_map(|(from, to)| CatalogRequest::Rename { from, to }),
        (text(), any::<bool>()).prop_map(|(path, parents)| CatalogRequest::Mkdir { path, parents }),
        (text(), meta_entry()).prop_map(|(path, entry)| CatalogRequest::MetaSet { path, entry }),
        (text(), text(), proptest::option::of(text()))
            .prop_map(|(path, attr, value)| CatalogRequest::MetaRm { path, attr, value }),
        text().prop_map(|path| CatalogRequest::MetaLs { path }),
        find_request().prop_map(|f| CatalogRequest::Find(Box::new(f))),
        (text(), any::<bool>())
            .prop_map(|(path, recursive)| CatalogRequest::Verify { path, recursive }),
        (text(), vec(text(), 0..4)).prop_map(|(path, paths)| CatalogRequest::Tar { path, paths }),
        (text(), any::<bool>(), text(), text(), text(), text()).prop_map(
            |(path, recursive, server, physical, address, at)| CatalogRequest::Replicated {
                path,
                recursive,
                server,
                physical,
                address,
                at,
            }
        ),
        text().prop_map(|path| CatalogRequest::Locate { path }),
    ]
}

fn catalog_policy() -> impl Strategy<Value = CatalogPolicy> {
    let owed =
        (any::<u32>(), any::<u64>(), text()).prop_map(|(tries, next_in_ms, note)| PolicyOwed {
            tries,
            next_in_ms,
            note,
        });
    (
        text(),
        any::<u32>(),
        any::<u64>(),
        "[a-z0-9]{0,16}",
        proptest::option::of(owed),
    )
        .prop_map(
            |(prefix, replicas, retain_s, checksum, owed)| CatalogPolicy {
                prefix,
                replicas,
                retain_s,
                checksum,
                owed,
            },
        )
}

fn catalog_object() -> impl Strategy<Value = CatalogObject> {
    (
        text(),
        any::<u64>(),
        any::<i64>(),
        vec(any::<u8>(), 0..=MAX_DIGEST),
        "[a-z0-9]{0,16}",
        text(),
        any::<i64>(),
    )
        .prop_map(
            |(path, size, mtime_ns, digest, algo, stored_by, stored_at)| CatalogObject {
                path,
                size,
                mtime_ns,
                digest,
                algo,
                stored_by,
                stored_at,
            },
        )
}

fn catalog_answer() -> impl Strategy<Value = CatalogAnswer> {
    let replica = (
        text(),
        text(),
        prop_oneof![
            Just(ReplicaHealth::Good),
            Just(ReplicaHealth::Stale),
            Just(ReplicaHealth::Bad)
        ],
        proptest::option::of(text()),
        proptest::option::of(text()),
    )
        .prop_map(|(server, physical, state, address, path)| CatalogReplica {
            server,
            physical,
            state,
            address: address.unwrap_or_default(),
            path: path.unwrap_or_default(),
        });
    prop_oneof![
        (any::<u64>(), any::<u64>())
            .prop_map(|(entries, objects)| CatalogAnswer::Done { entries, objects }),
        (
            catalog_object(),
            vec(replica, 0..=MAX_REPLICAS),
            vec(meta_entry(), 0..=16),
            proptest::option::of(catalog_policy())
        )
            .prop_map(|(object, replicas, metadata, policy)| CatalogAnswer::Stat(
                Box::new(CatalogStat {
                    object,
                    replicas,
                    metadata,
                    policy,
                })
            )),
        vec(meta_entry(), 0..=MAX_META_ENTRIES).prop_map(|entries| CatalogAnswer::Meta { entries }),
        (vec(catalog_object(), 0..=16), any::<bool>(), any::<bool>()).prop_map(
            |(objects, last, more)| CatalogAnswer::Found {
                objects,
                last,
                more: last && more,
            }
        ),
        (
            any::<[u64; 6]>(),
            vec((problem(), text()), 0..=16),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |(n, problems, last, more)| CatalogAnswer::Verified(Box::new(VerifyReport {
                    counts: VerifyCounts {
                        checked: n[0],
                        good: n[1],
                        bad: n[2],
                        missing: n[3],
                        unregistered: n[4],
                        bytes: n[5],
                    },
                    problems,
                    last,
                    more: last && more,
                }))
            ),
    ]
}

fn problem() -> impl Strategy<Value = Problem> {
    prop_oneof![
        Just(Problem::Bad),
        Just(Problem::Missing),
        Just(Problem::Unregistered)
    ]
}

fn decision() -> impl Strategy<Value = Decision> {
    prop_oneof![
        Just(Decision::Send),
        vec((0u64..u64::MAX - 1, 1u64..1 << 40), 0..30).prop_map(|v| Decision::Resume {
            have: v
                .into_iter()
                .map(|(s, l)| (s, s.saturating_add(l).max(s + 1)))
                .collect()
        }),
        vec(any::<u8>(), 1..=MAX_DIGEST).prop_map(|d| Decision::Complete {
            digest: Bytes::from(d)
        }),
        Just(Decision::Skip),
        (any::<u16>(), text()).prop_map(|(code, message)| Decision::Fail {
            code: ErrorCode(code),
            message
        }),
    ]
}

fn known_type() -> impl Strategy<Value = FrameType> {
    proptest::sample::select(
        sample_frames()
            .iter()
            .map(Frame::frame_type)
            .collect::<Vec<_>>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn roundtrip(frame in frame()) {
        let encoded = encode(&frame);
        prop_assert_eq!(encoded[0], frame.frame_type().0);
        prop_assert_eq!(decode(encoded), Ok(frame));
    }

    #[test]
    fn block_head_plus_data_is_the_frame(block in block()) {
        let mut split = BytesMut::new();
        block.encode_head(&mut split);
        split.extend_from_slice(&block.data);
        prop_assert_eq!(split, encode(&Frame::Block(block)));
    }

    #[test]
    fn trailing_bytes_are_rejected(frame in frame(), extra in vec(any::<u8>(), 1..4)) {
        let mut payload = payload_of(&frame).to_vec();
        payload.extend_from_slice(&extra);
        let ty = frame.frame_type();
        // A plain copy's request may end with its optional flags byte (bit 0 `only`, bit 1
        // stripe hosts follow, bit 2 `pull`): one without stripes is read as the flags, and
        // only what follows it is trailing; one with the stripe bit says stripe hosts follow,
        // and what follows is read as them.
        let flagless = matches!(
            &frame,
            Frame::CopyRequest(c) if !c.only && !c.pull && c.stripes.is_empty()
        );
        let flags = extra[0];
        let optional = flagless && matches!(flags, 1 | 4 | 5);
        let striped = flagless && matches!(flags, 2 | 3 | 6 | 7);
        let decoded = Frame::decode(ty, payload.into());
        // A stat without a policy may be followed by one: what follows is read as a policy,
        // and refused as one (a tag other than 1, or too short).
        let bare_stat = matches!(
            &frame,
            Frame::CatalogAnswer(CatalogAnswer::Stat(s)) if s.policy.is_none()
        );
        if bare_stat || striped {
            prop_assert!(decoded.is_err(), "{:?}", decoded);
        } else if optional && extra.len() == 1 {
            prop_assert!(
                matches!(
                    &decoded,
                    Ok(Frame::CopyRequest(c)) if c.only == (flags & 1 != 0) && c.pull == (flags & 4 != 0)
                ),
                "{:?}",
                decoded
            );
        } else {
            prop_assert_eq!(
                decoded,
                Err(DecodeError::TrailingBytes {
                    frame: ty.name(),
                    extra: extra.len() - usize::from(optional),
                })
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..1024)) {
        check_arbitrary_input(&bytes);
    }

    /// Random bytes rarely get past the first field; corrupting a valid frame reaches deep.
    #[test]
    fn corrupted_frames_never_panic(
        frame in frame(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = encode(&frame).to_vec();
        for (at, value) in flips {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check_arbitrary_input(&bytes);
    }

    #[test]
    fn any_payload_of_a_known_type_never_panics(ty in known_type(), payload in vec(any::<u8>(), 0..256)) {
        if let Ok(frame) = Frame::decode(ty, payload.clone().into()) {
            prop_assert_eq!(&payload_of(&frame)[..], &payload[..]);
        }
    }
}

/// What the fuzz target checks: no panic, and whatever decodes re-encodes to the same bytes
/// (the encoding is canonical) and decodes again to the same frame.
fn check_arbitrary_input(bytes: &[u8]) {
    let Some((header, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Ok(header) = FrameHeader::parse(header) else {
        return;
    };
    if let Ok(frame) = Frame::decode(header.ty, Bytes::copy_from_slice(payload)) {
        let encoded = encode(&frame);
        assert_eq!(&encoded[HEADER_LEN..], payload);
        assert_eq!(decode(encoded), Ok(frame));
    }
}

// ---------------------------------------------------------------------------------------------
// One frame of each type, for the exhaustive per-type checks and the fuzz seed corpus.

fn sample_opts() -> TransferOpts {
    TransferOpts {
        streams: 8,
        block_size: 1 << 20,
        checksum: ChecksumAlgo::Blake3,
        existing: ExistingPolicy::Overwrite,
        tcp_window: 0,
        auto_start: 4,
        storage_threads: 0,
    }
}

fn sample_frames() -> Vec<Frame> {
    let mut frames = vec![
        Frame::Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::ours(),
            role: Role::Control {
                token: "s3cret".into(),
                session: SessionId(9),
                secret: [0xcd; 32],
            },
        },
        Frame::Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::ours(),
            role: Role::Data {
                session: SessionId(7),
                secret: [0xab; 32],
                stream: 3,
            },
        },
        Frame::Welcome {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::ours(),
            session: SessionId(7),
            secret: [0xab; 32],
        },
        Frame::Error {
            code: ErrorCode::AUTH,
            message: "bad token".into(),
        },
        Frame::PutRequest {
            dest: "backups/today".into(),
            sources: 2,
            opts: sample_opts(),
        },
        Frame::GetRequest {
            src: "data/ünïcode".into(),
            opts: sample_opts(),
        },
        Frame::ListRequest {
            path: "data".into(),
        },
        Frame::Ready {
            streams: 4,
            block_size: 4 << 20,
        },
        Frame::ListEntries {
            entries: vec![
                ListEntry {
                    name: "a.txt".into(),
                    kind: EntryKind::File,
                    size: 12,
                    mode: 0o644,
                    mtime_ns: 1_700_000_000_000_000_000,
                },
                ListEntry {
                    name: "sub".into(),
                    kind: EntryKind::Dir,
                    size: 0,
                    mode: 0o755,
                    mtime_ns: -1,
                },
            ],
        },
        Frame::ListEnd,
        Frame::Block(Block {
            file: FileMeta {
                id: FileId(1),
                path: "dir/file.bin".into(),
                size: 10,
                mode: 0o600,
                mtime_ns: 42,
            },
            offset: 4,
            digest: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            file_digest: Some(Bytes::from_static(&[0x5a; 32])),
            early: true,
            data: Bytes::from_static(b"sixbyt"),
        }),
        Frame::Dir {
            path: "dir".into(),
            mode: 0o755,
            mtime_ns: 0,
        },
        Frame::Symlink {
            path: "link".into(),
            target: "../elsewhere".into(),
            mtime_ns: 5,
        },
        Frame::Sent {
            files: 3,
            dirs: 1,
            symlinks: 1,
            bytes: 1 << 30,
        },
        Frame::Resend {
            file: FileId(9),
            offset: 1 << 20,
            len: 1 << 20,
        },
        Frame::Skipped { file: FileId(2) },
        Frame::FileFailed {
            file: FileId(2),
            code: ErrorCode::EXISTS,
            message: "exists".into(),
        },
        Frame::Complete(CompleteSummary {
            files: 3,
            bytes: 1 << 30,
            skipped: 1,
            failed: 1,
            bad_blocks: 0,
            receiver: Load {
                cpu_permille: 310,
                starved_permille: 5,
                blocked_permille: 0,
                threads: 4,
            },
        }),
        Frame::Tuned(TuneReport {
            streams: 8,
            start: 4,
            flags: TuneReport::AUTO | TuneReport::SETTLED,
            sender: Load::default(),
            steps: vec![TuneStep {
                at_ms: 3100,
                streams: 4,
                rate: 117_000_000,
                noise_permille: 42,
                verdict: TuneVerdict::Baseline,
            }],
        }),
        Frame::Offer {
            entries: vec![OfferEntry {
                file: FileId(4),
                path: "run42/a.bin".into(),
                size: 1 << 30,
                mode: 0o644,
                mtime_ns: 1_700_000_000_000_000_000,
            }],
        },
        Frame::EntryFailed {
            path: "run42/link".into(),
            code: ErrorCode::EXISTS,
            message: "exists".into(),
        },
        Frame::Decisions {
            entries: vec![
                FileDecision {
                    file: FileId(4),
                    decision: Decision::Resume {
                        have: vec![(0, 8 << 20), (16 << 20, 24 << 20)],
                    },
                },
                FileDecision {
                    file: FileId(5),
                    decision: Decision::Complete {
                        digest: Bytes::from_static(&[0xab; 32]),
                    },
                },
                FileDecision {
                    file: FileId(6),
                    decision: Decision::Fail {
                        code: ErrorCode::EXISTS,
                        message: "exists".into(),
                    },
                },
            ],
        },
        Frame::ProbeRequest {
            direction: ProbeDirection::ServerToClient,
            streams: 4,
            duration_ms: 4000,
            window: 16 << 20,
        },
        Frame::ProbeResult {
            interval_ms: 100,
            intervals: vec![0, 1 << 20, 12_500_000],
            streams: vec![ProbeStream {
                bytes: 13_548_576,
                rtt_us: 101_000,
                min_rtt_us: 100_050,
                snd_cwnd: 900,
                snd_mss: 8948,
                total_retrans: 3,
            }],
        },
        Frame::ProbeData {
            data: Bytes::from_static(&[0; 16]),
        },
        Frame::GrantRequest {
            dest: "/incoming/run42/".into(),
            existing: ExistingPolicy::Skip,
        },
        Frame::Granted {
            grant: "ferry-grant:0123456789abcdef0123456789abcdef.00".into(),
            ttl_ms: 60_000,
        },
        Frame::CopyRequest(Box::new(sample_copy_request())),
        Frame::Paths {
            addrs: vec!["10.0.1.2:7070".into(), "[fd00::2]:7070".into()],
        },
        Frame::CopyProgress(CopyProgress {
            found_files: 10,
            found_bytes: 1 << 30,
            walk_done: true,
            files: 3,
            bytes: 1 << 20,
        }),
        Frame::CopyDone {
            summary: CompleteSummary {
                files: 2,
                bytes: 4096,
                ..CompleteSummary::default()
            },
            report: "{\"direction\":\"put\"}".into(),
        },
        Frame::StripeRequest {
            dest: "/incoming/run42/".into(),
            opts: sample_opts(),
        },
        Frame::Landed {
            file: FileId(7),
            offset: 8 << 20,
            len: 8 << 20,
            digest: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
            cvs: vec![[0xa5; 32], [0x5a; 32]],
        },
        Frame::RemoveRequest {
            paths: vec![
                "/incoming/run42/old.dat".into(),
                "/incoming/run42/gone/".into(),
            ],
            more: true,
        },
        Frame::Removed {
            removed: 1,
            failures: vec![RemoveFailure {
                index: 1,
                code: ErrorCode::IO,
                message: "Directory not empty".into(),
            }],
        },
        Frame::CopyPaths {
            paths: vec!["a.txt".into(), "sub".into(), "sub/b.bin".into()],
            more: false,
        },
    ];
    frames.extend(sample_catalog_frames());
    frames.push(Frame::TarData {
        data: Bytes::from_static(&[0u8; 1024]),
        last: true,
    });
    frames.push(Frame::FileDigest {
        file: FileId(7),
        digest: vec![0x3c; 32].into(),
    });
    frames.push(Frame::StripeRead {
        src: "/data/run42".into(),
        opts: sample_opts(),
    });
    frames.push(Frame::Fetch {
        file: FileId(7),
        path: "run42/big.dat".into(),
        size: 40 << 20,
        mtime_ns: 1_700_000_000_000_000_000,
        offset: 8 << 20,
        len: 8 << 20,
    });
    frames.push(Frame::StripeGrantRequest {
        dest: "/incoming/run42/".into(),
    });
    frames.push(Frame::CopyRequest(Box::new(CopyRequest {
        stripes: vec![sample_copy_stripe()],
        ..sample_copy_request()
    })));
    frames.push(Frame::ReadGrantRequest {
        src: "/data/run42".into(),
        stripe: true,
    });
    frames.push(Frame::CopyRequest(Box::new(CopyRequest {
        stripes: vec![sample_copy_stripe()],
        pull: true,
        ..sample_copy_request()
    })));
    frames
}

fn sample_copy_stripe() -> CopyStripe {
    CopyStripe {
        addr: "dtn3:7070".into(),
        fingerprint: [0x3c; 32],
        grant: "s".into(),
    }
}

/// One catalog request of each op and one answer of each kind.
fn sample_catalog_frames() -> Vec<Frame> {
    let entry = MetaEntry {
        attr: "instrument".into(),
        value: "42.5".into(),
        unit: "K".into(),
    };
    let object = CatalogObject {
        path: "incoming/run42/a.dat".into(),
        size: 1 << 20,
        mtime_ns: 1_700_000_000_123_456_789,
        digest: vec![0xab; 32],
        algo: "blake3".into(),
        stored_by: "alice".into(),
        stored_at: 1_700_000_001_000_000_000,
    };
    let requests = vec![
        CatalogRequest::Stat {
            path: "/incoming/run42/a.dat".into(),
        },
        CatalogRequest::Remove {
            path: "/incoming/run42".into(),
            recursive: true,
        },
        CatalogRequest::Rename {
            from: "/incoming/run42".into(),
            to: "/archive/run42".into(),
        },
        CatalogRequest::Mkdir {
            path: "/incoming/run43/raw".into(),
            parents: true,
        },
        CatalogRequest::MetaSet {
            path: "/incoming/run42/a.dat".into(),
            entry: entry.clone(),
        },
        CatalogRequest::MetaRm {
            path: "/incoming/run42/a.dat".into(),
            attr: "instrument".into(),
            value: Some("42.5".into()),
        },
        CatalogRequest::MetaLs {
            path: "/incoming/run42/a.dat".into(),
        },
        CatalogRequest::Verify {
            path: "incoming/run42".into(),
            recursive: true,
        },
        CatalogRequest::Find(Box::new(FindRequest {
            under: "/incoming".into(),
            conditions: vec![FindCondition {
                compare: Compare::Gt,
                attr: "temp".into(),
                value: "40".into(),
            }],
            name: Some("*.dat".into()),
            newer_ns: Some(1_600_000_000_000_000_000),
            larger: Some(1024),
            limit: 1000,
        })),
        CatalogRequest::Tar {
            path: "/incoming/run42".into(),
            paths: vec!["a.dat".into(), "sub dir".into()],
        },
        CatalogRequest::Replicated {
            path: "/incoming/run42".into(),
            recursive: true,
            server: "dtn2".into(),
            physical: "/srv/ferry/incoming/run42".into(),
            address: String::new(),
            at: String::new(),
        },
        CatalogRequest::Replicated {
            path: "/incoming/run42".into(),
            recursive: true,
            server: "dtn2".into(),
            physical: "/srv/ferry/incoming/run42".into(),
            address: "dtn2.example.org:7070".into(),
            at: String::new(),
        },
        CatalogRequest::Replicated {
            path: "/incoming/run42".into(),
            recursive: true,
            server: "dtn2".into(),
            physical: "/srv/ferry/archive/run42".into(),
            address: "dtn2.example.org:7070".into(),
            at: "archive/run42".into(),
        },
        CatalogRequest::Locate {
            path: "/incoming/run42/a.dat".into(),
        },
    ];
    let answers = vec![
        CatalogAnswer::Done {
            entries: 3,
            objects: 2,
        },
        CatalogAnswer::Stat(Box::new(CatalogStat {
            object: object.clone(),
            replicas: vec![CatalogReplica {
                server: "dtn2".into(),
                physical: "/srv/ferry/incoming/run42/a.dat".into(),
                state: ReplicaHealth::Good,
                address: String::new(),
                path: String::new(),
            }],
            metadata: vec![entry.clone()],
            policy: Some(CatalogPolicy {
                prefix: "incoming".into(),
                replicas: 2,
                retain_s: 30 * 86_400,
                checksum: "sha256".into(),
                owed: Some(PolicyOwed {
                    tries: 3,
                    next_in_ms: 4_000,
                    note: "peer siteB (dtn2:7070): connection refused".into(),
                }),
            }),
        })),
        CatalogAnswer::Stat(Box::new(CatalogStat {
            object: object.clone(),
            replicas: vec![
                CatalogReplica {
                    server: "dtn1".into(),
                    physical: "/srv/ferry/incoming/run42/a.dat".into(),
                    state: ReplicaHealth::Good,
                    address: "dtn1.example.org:7070".into(),
                    path: String::new(),
                },
                CatalogReplica {
                    server: "tape".into(),
                    physical: "/archive/run42/a.dat".into(),
                    state: ReplicaHealth::Bad,
                    address: String::new(),
                    path: "archive/run42/a.dat".into(),
                },
            ],
            metadata: vec![entry.clone()],
            // A policy here too: bytes after a stat without one are read as its policy, so a
            // bare stat cannot show a trailing byte refused (`a_stats_policy_is_trailing_...`).
            policy: Some(CatalogPolicy {
                prefix: "run42".into(),
                replicas: 3,
                retain_s: 0,
                checksum: String::new(),
                owed: None,
            }),
        })),
        CatalogAnswer::Meta {
            entries: vec![entry],
        },
        CatalogAnswer::Found {
            objects: vec![object],
            last: true,
            more: true,
        },
        CatalogAnswer::Verified(Box::new(VerifyReport {
            counts: VerifyCounts {
                checked: 3,
                good: 1,
                bad: 1,
                missing: 1,
                unregistered: 1,
                bytes: 1 << 20,
            },
            problems: vec![
                (Problem::Bad, "incoming/run42/a.dat".into()),
                (Problem::Unregistered, "incoming/run42/new.dat".into()),
            ],
            last: true,
            more: false,
        })),
    ];
    requests
        .into_iter()
        .map(Frame::CatalogRequest)
        .chain(answers.into_iter().map(Frame::CatalogAnswer))
        .collect()
}

fn sample_copy_request() -> CopyRequest {
    CopyRequest {
        src: "/data/run42".into(),
        dest: "/incoming/".into(),
        peer: "dtn2:7070".into(),
        fingerprint: [0x5a; 32],
        grant: "g".into(),
        opts: sample_opts(),
        only: false,
        stripes: Vec::new(),
        pull: false,
    }
}

#[test]
fn samples_cover_every_frame_type() {
    let mut types: Vec<u8> = sample_frames().iter().map(|f| f.frame_type().0).collect();
    types.sort_unstable();
    types.dedup();
    assert_eq!(types.len(), 43);
    for ty in 0..=u8::MAX {
        assert_eq!(
            FrameType(ty).max_payload().is_some(),
            types.contains(&ty),
            "type {ty:#04x}"
        );
    }
}

#[test]
fn every_truncation_is_an_error() {
    for frame in sample_frames() {
        let payload = payload_of(&frame);
        assert_eq!(
            Frame::decode(frame.frame_type(), payload.clone()),
            Ok(frame.clone())
        );
        // A stat cut just before its optional policy is a stat without one.
        let bare = match &frame {
            Frame::CatalogAnswer(CatalogAnswer::Stat(st)) if st.policy.is_some() => {
                let mut st = st.clone();
                st.policy = None;
                Some(Frame::CatalogAnswer(CatalogAnswer::Stat(st)))
            }
            // A copy request cut just before its flags byte is a plain copy's.
            Frame::CopyRequest(c) if c.only || c.pull || !c.stripes.is_empty() => {
                Some(Frame::CopyRequest(Box::new(CopyRequest {
                    only: false,
                    pull: false,
                    stripes: Vec::new(),
                    ..(**c).clone()
                })))
            }
            _ => None,
        };
        let bare_len = bare.as_ref().map(|b| payload_of(b).len());
        for len in 0..payload.len() {
            match Frame::decode(frame.frame_type(), payload.slice(..len)) {
                Ok(f) if Some(len) == bare_len && Some(&f) == bare.as_ref() => {}
                Err(DecodeError::Truncated { .. }) => {}
                other => panic!("{frame:?} cut to {len} bytes: {other:?}"),
            }
        }
    }
}

#[test]
fn every_type_rejects_a_trailing_byte() {
    for frame in sample_frames() {
        let ty = frame.frame_type();
        let mut payload = payload_of(&frame).to_vec();
        payload.push(0);
        assert_eq!(
            Frame::decode(ty, payload.into()),
            Err(DecodeError::TrailingBytes {
                frame: ty.name(),
                extra: 1
            })
        );
    }
}

/// Regenerates `fuzz/corpus/frame_decode` after a layout change:
/// `cargo test -p ferry-proto --test codec -- --ignored write_fuzz_seeds`.
#[test]
#[ignore = "writes into fuzz/corpus; run by hand"]
fn write_fuzz_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/frame_decode");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, frame) in sample_frames().iter().enumerate() {
        let name = format!("{i:02}-{}", frame.frame_type().name());
        std::fs::write(dir.join(name), encode(frame)).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Pinned bytes: if one of these changes, the wire format changed and PROTOCOL_VERSION must too.

#[test]
fn pinned_hello() {
    let frame = Frame::Hello {
        version: 2,
        capabilities: Capabilities(1),
        role: Role::Control {
            token: "tok".into(),
            session: SessionId(0x0102),
            secret: [0x5a; 32],
        },
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x01, 0, 0, 0, 0x40,                            // type, payload length 64
        b'F', b'E', b'R', b'R', b'Y', b'\r', b'\n', 0x1a, // magic
        0, 2,                                           // version
        0, 0, 0, 0, 0, 0, 0, 1,                         // capabilities
        0,                                              // role: control
        0, 3, b't', b'o', b'k',                         // token
        0, 0, 0, 0, 0, 0, 1, 2,                         // session
        0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, // secret
        0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
        0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
        0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(expected.into()), Ok(frame));
}

#[test]
fn pinned_get_request() {
    let frame = Frame::GetRequest {
        src: "d".into(),
        opts: TransferOpts {
            streams: 16,
            block_size: 8 << 20,
            checksum: ChecksumAlgo::Xxh3,
            existing: ExistingPolicy::Skip,
            tcp_window: 0x0100_0000,
            auto_start: 4,
            storage_threads: 12,
        },
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x11, 0, 0, 0, 19,                  // type, payload length
        0, 1, b'd',                         // src
        0, 16,                              // streams (the most, with auto)
        0, 0x80, 0, 0,                      // block_size 8 MiB
        2,                                  // checksum: xxh3
        2,                                  // existing: skip
        0x01, 0, 0, 0,                      // tcp_window 16 MiB
        0, 4,                               // auto_start: tuned, starting with 4
        0, 12,                              // storage_threads: 12 readers asked of the server
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(expected.into()), Ok(frame));
}

#[test]
fn pinned_complete() {
    let frame = Frame::Complete(CompleteSummary {
        files: 1,
        bytes: 2,
        skipped: 3,
        failed: 4,
        bad_blocks: 5,
        receiver: Load {
            cpu_permille: 0x0102,
            starved_permille: 7,
            blocked_permille: 1000,
            threads: 2,
        },
    });
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x34, 0, 0, 0, 48,                  // type, payload length
        0, 0, 0, 0, 0, 0, 0, 1,             // files
        0, 0, 0, 0, 0, 0, 0, 2,             // bytes
        0, 0, 0, 0, 0, 0, 0, 3,             // skipped
        0, 0, 0, 0, 0, 0, 0, 4,             // failed
        0, 0, 0, 0, 0, 0, 0, 5,             // bad_blocks
        0x01, 0x02,                         // receiver cpu_permille
        0, 7,                               // receiver starved_permille
        0x03, 0xe8,                         // receiver blocked_permille
        0, 2,                               // receiver threads (writers)
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(expected.into()), Ok(frame));
}

#[test]
fn pinned_tuned() {
    let frame = Frame::Tuned(TuneReport {
        streams: 8,
        start: 4,
        flags: TuneReport::AUTO | TuneReport::SETTLED,
        sender: Load {
            cpu_permille: 1,
            starved_permille: 2,
            blocked_permille: 3,
            threads: 5,
        },
        steps: vec![TuneStep {
            at_ms: 0x0102_0304,
            streams: 4,
            rate: 125_000_000,
            noise_permille: 0x0123,
            verdict: TuneVerdict::Kept,
        }],
    });
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x38, 0, 0, 0, 31,                  // type, payload length
        0, 8,                               // streams at the end
        0, 4,                               // start
        0b011,                              // flags: auto, settled
        0, 1, 0, 2, 0, 3, 0, 5,             // sender load (threads: 5 readers)
        1,                                  // one step
        0x01, 0x02, 0x03, 0x04,             // at_ms
        0, 4,                               // streams
        0, 0, 0, 0, 0x07, 0x73, 0x59, 0x40, // rate 125,000,000 B/s
        0x01, 0x23,                         // noise: 29.1%
        1,                                  // verdict: kept
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(expected.into()), Ok(frame));
    // Unknown flags, verdicts and too many steps are refused.
    let mut bad = expected.to_vec();
    bad[HEADER_LEN + 4] = 0x80;
    assert_eq!(
        decode(bad.as_slice().into()),
        Err(DecodeError::InvalidValue {
            field: "flags",
            value: 0x80
        })
    );
    let mut bad = expected.to_vec();
    *bad.last_mut().unwrap() = 4;
    assert_eq!(
        decode(bad.as_slice().into()),
        Err(DecodeError::InvalidValue {
            field: "verdict",
            value: 4
        })
    );
    let mut bad = expected.to_vec();
    bad[HEADER_LEN + 13] = (MAX_TUNE_STEPS + 1) as u8;
    assert_eq!(
        decode(bad.as_slice().into()),
        Err(DecodeError::TooLong {
            field: "tune steps",
            len: MAX_TUNE_STEPS + 1,
            max: MAX_TUNE_STEPS
        })
    );
}

#[test]
fn pinned_resend() {
    let frame = Frame::Resend {
        file: FileId(0x0102),
        offset: 0x0a0b_0c0d_0e0f,
        len: 0xffff_0001,
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x31, 0, 0, 0, 20,                  // type, payload length
        0, 0, 0, 0, 0, 0, 0x01, 0x02,       // file
        0, 0, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, // offset
        0xff, 0xff, 0, 1,                   // len
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(expected.into()), Ok(frame));
}

#[test]
fn pinned_block() {
    let frame = Frame::Block(Block {
        file: FileMeta {
            id: FileId(5),
            path: "a".into(),
            size: 3,
            mode: 0o644,
            mtime_ns: -1,
        },
        offset: 1,
        digest: 0x11,
        file_digest: Some(Bytes::from_static(&[0xee, 0xff])),
        early: true,
        data: Bytes::from_static(b"xy"),
    });
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x20, 0, 0, 0, 65,                  // type, payload length
        0, 0, 0, 0, 0, 0, 0, 5,             // file id
        0, 1, b'a',                         // path
        0, 0, 0, 0, 0, 0, 0, 3,             // size
        0, 0, 0x01, 0xa4,                   // mode 0o644
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // mtime_ns -1
        0, 0, 0, 0, 0, 0, 0, 1,             // offset
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, // digest
        2, 0xee, 0xff,                      // file digest
        1,                                  // flags: early
        0, 0, 0, 2,                         // data length
        b'x', b'y',                         // data
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(expected.into()), Ok(frame));
}

// ---------------------------------------------------------------------------------------------
// Limits and validation, at their exact boundaries.

#[test]
fn header_rejects_unknown_types_and_oversized_payloads() {
    assert_eq!(
        FrameHeader::parse(&[0x7f, 0, 0, 0, 0]),
        Err(DecodeError::UnknownFrameType(0x7f))
    );
    let over = (MAX_CONTROL_PAYLOAD + 1).to_be_bytes();
    assert_eq!(
        FrameHeader::parse(&[0x01, over[0], over[1], over[2], over[3]]),
        Err(DecodeError::FrameTooLarge {
            frame: "hello",
            len: MAX_CONTROL_PAYLOAD + 1,
            max: MAX_CONTROL_PAYLOAD
        })
    );
    let max = MAX_BLOCK_PAYLOAD.to_be_bytes();
    assert_eq!(
        FrameHeader::parse(&[0x20, max[0], max[1], max[2], max[3]]),
        Ok(FrameHeader {
            ty: FrameType::BLOCK,
            len: MAX_BLOCK_PAYLOAD
        })
    );
    assert_eq!(
        Frame::decode(FrameType(0), Bytes::new()),
        Err(DecodeError::UnknownFrameType(0))
    );
}

#[test]
fn hello_needs_the_magic() {
    let mut payload = payload_of(&sample_frames()[0]).to_vec();
    payload[0] = b'G';
    assert_eq!(
        Frame::decode(FrameType::HELLO, payload.into()),
        Err(DecodeError::BadMagic)
    );
}

#[test]
fn strings_are_limited_before_allocation() {
    let at_limit = Frame::ListRequest {
        path: "p".repeat(MAX_PATH),
    };
    assert_eq!(decode(encode(&at_limit)), Ok(at_limit));

    // The length prefix alone is refused: no bytes follow it.
    let len = u16::try_from(MAX_PATH + 1).unwrap().to_be_bytes();
    assert_eq!(
        Frame::decode(FrameType::LIST_REQUEST, Bytes::copy_from_slice(&len)),
        Err(DecodeError::TooLong {
            field: "path",
            len: MAX_PATH + 1,
            max: MAX_PATH
        })
    );

    let token = Frame::Hello {
        version: 1,
        capabilities: Capabilities(0),
        role: Role::Control {
            token: "t".repeat(MAX_TOKEN + 1),
            session: SessionId(1),
            secret: [1; 32],
        },
    };
    assert_eq!(
        decode(encode(&token)),
        Err(DecodeError::TooLong {
            field: "token",
            len: MAX_TOKEN + 1,
            max: MAX_TOKEN
        })
    );
}

#[test]
fn strings_must_be_utf8() {
    assert_eq!(
        Frame::decode(
            FrameType::DIR,
            Bytes::from_static(&[0, 1, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        ),
        Err(DecodeError::InvalidUtf8 { field: "path" })
    );
}

#[test]
fn long_messages_are_cut_at_a_char_boundary() {
    // 'é' is two bytes, so MAX_MESSAGE falls in the middle of one when preceded by one byte.
    let message = format!("x{}", "é".repeat(MAX_MESSAGE));
    let Ok(Frame::Error { message: sent, .. }) = decode(encode(&Frame::Error {
        code: ErrorCode::IO,
        message: message.clone(),
    })) else {
        panic!("a long message must still encode to a valid frame");
    };
    assert_eq!(sent.len(), MAX_MESSAGE - 1);
    assert!(message.starts_with(&sent));
}

#[test]
fn listings_are_limited() {
    let entry = ListEntry {
        name: String::new(),
        kind: EntryKind::Other,
        size: 0,
        mode: 0,
        mtime_ns: 0,
    };
    let full = Frame::ListEntries {
        entries: vec![entry.clone(); MAX_LIST_ENTRIES],
    };
    assert_eq!(decode(encode(&full)), Ok(full));
    let over = Frame::ListEntries {
        entries: vec![entry; MAX_LIST_ENTRIES + 1],
    };
    assert_eq!(
        decode(encode(&over)),
        Err(DecodeError::TooLong {
            field: "count",
            len: MAX_LIST_ENTRIES + 1,
            max: MAX_LIST_ENTRIES
        })
    );
    let bad_kind = [0, 1, 0, 0, 4];
    assert_eq!(
        Frame::decode(FrameType::LIST_ENTRIES, Bytes::copy_from_slice(&bad_kind)),
        Err(DecodeError::InvalidValue {
            field: "kind",
            value: 4
        })
    );
}

#[test]
fn transfer_options_are_range_checked() {
    let cases = [
        (
            TransferOpts {
                streams: 0,
                ..sample_opts()
            },
            "streams",
            0,
        ),
        (
            TransferOpts {
                streams: MAX_STREAMS + 1,
                ..sample_opts()
            },
            "streams",
            u64::from(MAX_STREAMS) + 1,
        ),
        (
            TransferOpts {
                block_size: MIN_BLOCK_SIZE - 1,
                ..sample_opts()
            },
            "block_size",
            4095,
        ),
        (
            TransferOpts {
                block_size: MAX_BLOCK_DATA + 1,
                ..sample_opts()
            },
            "block_size",
            u64::from(MAX_BLOCK_DATA) + 1,
        ),
        (
            TransferOpts {
                auto_start: MAX_STREAMS + 1,
                ..sample_opts()
            },
            "auto_start",
            u64::from(MAX_STREAMS) + 1,
        ),
        (
            TransferOpts {
                storage_threads: MAX_STORAGE_THREADS + 1,
                ..sample_opts()
            },
            "storage_threads",
            u64::from(MAX_STORAGE_THREADS) + 1,
        ),
    ];
    for (opts, field, value) in cases {
        let frame = Frame::GetRequest {
            src: String::new(),
            opts,
        };
        assert_eq!(
            decode(encode(&frame)),
            Err(DecodeError::InvalidValue { field, value })
        );
    }
    // src "" (2 bytes), streams (2), block_size (4), then checksum and existing.
    for (at, field, value) in [(8, "checksum", 0), (8, "checksum", 5), (9, "existing", 3)] {
        let mut payload = payload_of(&Frame::GetRequest {
            src: String::new(),
            opts: sample_opts(),
        })
        .to_vec();
        payload[at] = value;
        assert_eq!(
            Frame::decode(FrameType::GET_REQUEST, payload.into()),
            Err(DecodeError::InvalidValue {
                field,
                value: value.into()
            })
        );
    }
    let ready = Frame::Ready {
        streams: 0,
        block_size: MIN_BLOCK_SIZE,
    };
    assert_eq!(
        decode(encode(&ready)),
        Err(DecodeError::InvalidValue {
            field: "streams",
            value: 0
        })
    );
}

#[test]
fn hello_role_is_checked() {
    let mut payload = payload_of(&sample_frames()[0]).to_vec();
    payload[18] = 2; // magic (8), version (2), capabilities (8), then the role byte
    assert_eq!(
        Frame::decode(FrameType::HELLO, payload.into()),
        Err(DecodeError::InvalidValue {
            field: "role",
            value: 2
        })
    );
}

fn sample_block() -> Block {
    let Frame::Block(block) = sample_frames().swap_remove(10) else {
        unreachable!()
    };
    block
}

#[test]
fn block_data_is_zero_copy() {
    let payload = payload_of(&Frame::Block(sample_block()));
    let Ok(Frame::Block(block)) = Frame::decode(FrameType::BLOCK, payload.clone()) else {
        panic!("sample block must decode");
    };
    let within = |b: &Bytes| payload.as_ptr_range().contains(&b.as_ptr());
    assert!(within(&block.data));
    assert!(within(block.file_digest.as_ref().unwrap()));
}

#[test]
fn block_consistency_is_checked() {
    let inconsistent = |field, reason| Err(DecodeError::Inconsistent { field, reason });
    let check = |edit: &dyn Fn(&mut Block)| {
        let mut block = sample_block();
        edit(&mut block);
        decode(encode(&Frame::Block(block)))
    };

    assert_eq!(
        check(&|b| b.offset = u64::MAX - 1),
        inconsistent("offset", "offset + data length overflows")
    );
    assert_eq!(
        check(&|b| b.file.size = 9),
        inconsistent("data", "block extends past the end of the file")
    );
    assert_eq!(
        check(&|b| b.file.size = 11),
        inconsistent(
            "file_digest",
            "present on a block that does not end the file"
        )
    );
    // Without a file digest, a block may sit anywhere inside the file.
    let mid = check(&|b| {
        b.file.size = 11;
        b.file_digest = None;
    });
    assert!(mid.is_ok(), "{mid:?}");
    // An empty file is one empty, final block.
    let empty = check(&|b| {
        b.file.size = 0;
        b.offset = 0;
        b.data = Bytes::new();
    });
    assert!(empty.is_ok(), "{empty:?}");
}

#[test]
fn block_lengths_are_limited() {
    let mut payload = payload_of(&Frame::Block(sample_block())).to_vec();
    // id (8), path (2 + 12), size (8), mode (4), mtime (8), offset (8), digest (16)
    let digest_len_at = 8 + 14 + 8 + 4 + 8 + 8 + 16;
    payload[digest_len_at] = u8::try_from(MAX_DIGEST + 1).unwrap();
    assert_eq!(
        Frame::decode(FrameType::BLOCK, payload.clone().into()),
        Err(DecodeError::TooLong {
            field: "file_digest",
            len: MAX_DIGEST + 1,
            max: MAX_DIGEST
        })
    );

    payload[digest_len_at] = 0;
    payload.truncate(digest_len_at + 1);
    // Flags: only bit 0 (early) is defined.
    let mut flagged = payload.clone();
    flagged.push(0x02);
    flagged.extend_from_slice(&[0, 0, 0, 0]);
    assert!(matches!(
        Frame::decode(FrameType::BLOCK, flagged.into()),
        Err(DecodeError::InvalidValue { field: "flags", .. })
    ));
    payload.push(0);
    payload.extend_from_slice(&(MAX_BLOCK_DATA + 1).to_be_bytes());
    assert_eq!(
        Frame::decode(FrameType::BLOCK, payload.into()),
        Err(DecodeError::TooLong {
            field: "data",
            len: MAX_BLOCK_DATA as usize + 1,
            max: MAX_BLOCK_DATA as usize
        })
    );
}

#[test]
fn decode_enforces_the_header_bound_too() {
    let payload = Bytes::from(vec![0; MAX_CONTROL_PAYLOAD as usize + 1]);
    assert_eq!(
        Frame::decode(FrameType::SKIPPED, payload),
        Err(DecodeError::FrameTooLarge {
            frame: "skipped",
            len: MAX_CONTROL_PAYLOAD + 1,
            max: MAX_CONTROL_PAYLOAD
        })
    );
}

#[test]
fn pinned_probe_request() {
    let frame = Frame::ProbeRequest {
        direction: ProbeDirection::ClientToServer,
        streams: 4,
        duration_ms: 4000,
        window: 0,
    };
    assert_eq!(
        &encode(&frame)[..],
        &[
            0x16, 0, 0, 0, 11, // header
            0,  // direction
            0, 4, // streams
            0, 0, 0x0f, 0xa0, // duration_ms
            0, 0, 0, 0, // window
        ]
    );
}

#[test]
fn probe_frames_are_range_checked() {
    let request = |direction: u8, streams: u16| {
        let mut p = vec![direction];
        p.extend_from_slice(&streams.to_be_bytes());
        p.extend_from_slice(&[0; 8]);
        Frame::decode(FrameType::PROBE_REQUEST, p.into())
    };
    assert!(request(1, 1).is_ok());
    assert_eq!(
        request(2, 1),
        Err(DecodeError::InvalidValue {
            field: "direction",
            value: 2
        })
    );
    for streams in [0, MAX_STREAMS + 1, 10_000] {
        assert_eq!(
            request(0, streams),
            Err(DecodeError::InvalidValue {
                field: "streams",
                value: u64::from(streams)
            })
        );
    }

    // interval_ms 0, then a count of intervals over the bound.
    assert_eq!(
        Frame::decode(FrameType::PROBE_RESULT, vec![0, 0, 0, 0, 0, 0].into()),
        Err(DecodeError::InvalidValue {
            field: "interval_ms",
            value: 0
        })
    );
    let mut p = 100u16.to_be_bytes().to_vec();
    p.extend_from_slice(
        &u16::try_from(MAX_PROBE_INTERVALS + 1)
            .unwrap()
            .to_be_bytes(),
    );
    assert_eq!(
        Frame::decode(FrameType::PROBE_RESULT, p.into()),
        Err(DecodeError::TooLong {
            field: "intervals",
            len: MAX_PROBE_INTERVALS + 1,
            max: MAX_PROBE_INTERVALS
        })
    );

    // Filler whose length prefix promises more than the payload holds.
    let mut p = 8u32.to_be_bytes().to_vec();
    p.extend_from_slice(&[0; 4]);
    assert_eq!(
        Frame::decode(FrameType::PROBE_DATA, p.into()),
        Err(DecodeError::Truncated { field: "data" })
    );
}

#[test]
fn pinned_copy_progress() {
    let frame = Frame::CopyProgress(CopyProgress {
        found_files: 1,
        found_bytes: 2,
        walk_done: true,
        files: 3,
        bytes: 4,
    });
    assert_eq!(
        &encode(&frame)[..],
        &[
            0x39, 0, 0, 0, 33, // header
            0, 0, 0, 0, 0, 0, 0, 1, // found_files
            0, 0, 0, 0, 0, 0, 0, 2, // found_bytes
            1, // walk_done
            0, 0, 0, 0, 0, 0, 0, 3, // files
            0, 0, 0, 0, 0, 0, 0, 4, // bytes
        ]
    );
}

#[test]
fn pinned_granted() {
    let frame = Frame::Granted {
        grant: "ab".into(),
        ttl_ms: 1000,
    };
    assert_eq!(
        &encode(&frame)[..],
        &[0x19, 0, 0, 0, 8, 0, 2, b'a', b'b', 0, 0, 0x03, 0xe8]
    );
}

#[test]
fn copy_frames_are_range_checked() {
    // walk_done is a boolean byte.
    let mut p = payload_of(&Frame::CopyProgress(CopyProgress::default())).to_vec();
    p[16] = 2;
    assert!(matches!(
        Frame::decode(FrameType::COPY_PROGRESS, Bytes::from(p)),
        Err(DecodeError::InvalidValue {
            field: "walk_done",
            ..
        })
    ));
    // A peer address longer than MAX_ADDR is refused before it is read.
    let mut long = sample_copy_request();
    long.peer = "p".repeat(MAX_ADDR + 1);
    assert!(matches!(
        decode(encode(&Frame::CopyRequest(Box::new(long)))),
        Err(DecodeError::TooLong { field: "peer", .. })
    ));
    // A grant is a token: at most MAX_TOKEN bytes.
    let long = Frame::Granted {
        grant: "g".repeat(MAX_TOKEN + 1),
        ttl_ms: 0,
    };
    assert!(matches!(
        decode(encode(&long)),
        Err(DecodeError::TooLong { field: "grant", .. })
    ));
    // A report's u32 length is checked against MAX_REPORT before anything is copied.
    let mut p = payload_of(&Frame::CopyDone {
        summary: CompleteSummary::default(),
        report: String::new(),
    })
    .to_vec();
    let at = p.len() - 4;
    p[at..].copy_from_slice(&u32::try_from(MAX_REPORT + 1).unwrap().to_be_bytes());
    assert!(matches!(
        Frame::decode(FrameType::COPY_DONE, Bytes::from(p)),
        Err(DecodeError::TooLong {
            field: "report",
            ..
        })
    ));
}

#[test]
fn pinned_paths_and_their_limit() {
    let frame = Frame::Paths {
        addrs: vec!["a:1".into()],
    };
    assert_eq!(
        &encode(&frame)[..],
        &[0x1B, 0, 0, 0, 7, 0, 1, 0, 3, b'a', b':', b'1']
    );
    let many = Frame::Paths {
        addrs: vec![String::new(); MAX_PATHS + 1],
    };
    assert!(matches!(
        decode(encode(&many)),
        Err(DecodeError::TooLong { field: "count", .. })
    ));
}

#[test]
fn pinned_landed_and_its_limits() {
    let frame = Frame::Landed {
        file: FileId(2),
        offset: 0x100,
        len: 0x40,
        digest: 5,
        cvs: vec![[7; 32]],
    };
    #[rustfmt::skip]
    let mut expected: Vec<u8> = vec![
        0x3B, 0, 0, 0, 69,              // type, payload length
        0, 0, 0, 0, 0, 0, 0, 2,         // file
        0, 0, 0, 0, 0, 0, 1, 0,         // offset
        0, 0, 0, 0x40,                  // len
        0, 0, 0, 0, 0, 0, 0, 0,         // digest (u128, big endian)
        0, 0, 0, 0, 0, 0, 0, 5,
        1,                              // cvs: count, then 32 bytes each
    ];
    expected.extend_from_slice(&[7; 32]);
    assert_eq!(&encode(&frame)[..], &expected[..]);
    assert_eq!(decode(encode(&frame)), Ok(frame));
    // Without chaining values (another digest than BLAKE3): one byte of count.
    let plain = Frame::Landed {
        file: FileId(2),
        offset: 0x100,
        len: 0x40,
        digest: 5,
        cvs: Vec::new(),
    };
    assert_eq!(encode(&plain).len(), 5 + 37);
    assert_eq!(decode(encode(&plain)), Ok(plain));
    // More chaining values than any block has is refused before they are read.
    let many = Frame::Landed {
        file: FileId(2),
        offset: 0,
        len: 1,
        digest: 0,
        cvs: vec![[0; 32]; MAX_LANDED_CVS + 1],
    };
    assert!(matches!(
        decode(encode(&many)),
        Err(DecodeError::TooLong { field: "cvs", .. })
    ));
    // An empty block, one beyond the largest, or one past the largest file is refused.
    for (offset, len) in [(0, 0), (0, MAX_BLOCK_DATA + 1), (i64::MAX as u64, 1)] {
        let bad = Frame::Landed {
            file: FileId(1),
            offset,
            len,
            digest: 0,
            cvs: Vec::new(),
        };
        assert!(
            matches!(decode(encode(&bad)), Err(DecodeError::InvalidValue { .. })),
            "{offset} {len}"
        );
    }
}

#[test]
fn pinned_file_digest_and_its_limits() {
    let frame = Frame::FileDigest {
        file: FileId(2),
        digest: vec![9; 3].into(),
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x3F, 0, 0, 0, 12,              // type, payload length
        0, 0, 0, 0, 0, 0, 0, 2,         // file
        3, 9, 9, 9,                     // digest: length, then its bytes
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(encode(&frame)), Ok(frame));
    // An empty digest (a block carries none by leaving it out) and a longer one than any
    // algorithm's are refused.
    let empty = Frame::FileDigest {
        file: FileId(2),
        digest: Default::default(),
    };
    assert!(matches!(
        decode(encode(&empty)),
        Err(DecodeError::InvalidValue {
            field: "digest_len",
            ..
        })
    ));
    let long = Frame::FileDigest {
        file: FileId(2),
        digest: vec![0; MAX_DIGEST + 1].into(),
    };
    assert!(matches!(
        decode(encode(&long)),
        Err(DecodeError::TooLong {
            field: "digest",
            ..
        })
    ));
}

#[test]
fn pinned_stripe_request() {
    let frame = Frame::StripeRequest {
        dest: "d/".into(),
        opts: sample_opts(),
    };
    let put = Frame::PutRequest {
        dest: "d/".into(),
        sources: 0,
        opts: sample_opts(),
    };
    let (stripe, put) = (encode(&frame), encode(&put));
    // The put's layout less its `sources`: the destination, then the options.
    assert_eq!(stripe[0], 0x1C);
    assert_eq!(&stripe[5..9], &[0, 2, b'd', b'/']);
    assert_eq!(&stripe[9..], &put[13..]);
    assert_eq!(decode(stripe), Ok(frame));
    let long = Frame::StripeRequest {
        dest: "x".repeat(MAX_PATH + 1),
        opts: sample_opts(),
    };
    assert!(matches!(
        decode(encode(&long)),
        Err(DecodeError::TooLong { field: "dest", .. })
    ));
}

#[test]
fn pinned_stripe_read_and_fetch_and_their_limits() {
    let read = Frame::StripeRead {
        src: "d".into(),
        opts: sample_opts(),
    };
    let get = Frame::GetRequest {
        src: "d".into(),
        opts: sample_opts(),
    };
    // A get's layout under another type.
    let (read_bytes, get_bytes) = (encode(&read), encode(&get));
    assert_eq!(read_bytes[0], 0x1F);
    assert_eq!(&read_bytes[1..], &get_bytes[1..]);
    assert_eq!(decode(read_bytes), Ok(read));
    let frame = Frame::Fetch {
        file: FileId(2),
        path: "a".into(),
        size: 10,
        mtime_ns: -1,
        offset: 4,
        len: 6,
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x25, 0, 0, 0, 39,                      // type, payload length
        0, 0, 0, 0, 0, 0, 0, 2,                 // file
        0, 1, b'a',                             // path
        0, 0, 0, 0, 0, 0, 0, 10,                // size
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // mtime_ns
        0, 0, 0, 0, 0, 0, 0, 4,                 // offset
        0, 0, 0, 6,                             // len
    ];
    assert_eq!(&encode(&frame)[..], expected);
    assert_eq!(decode(encode(&frame)), Ok(frame));
    // Empty, past the file's end, or larger than any block: refused.
    for (offset, len, size) in [
        (0, 0, 10),
        (5, 6, 10),
        (0, MAX_BLOCK_DATA + 1, u64::MAX >> 1),
    ] {
        let bad = Frame::Fetch {
            file: FileId(2),
            path: "a".into(),
            size,
            mtime_ns: 0,
            offset,
            len,
        };
        assert!(
            matches!(decode(encode(&bad)), Err(DecodeError::InvalidValue { .. })),
            "{offset} {len} {size}"
        );
    }
}

#[test]
fn pinned_remove_frames_and_their_limits() {
    let frame = Frame::RemoveRequest {
        paths: vec!["a/b".into()],
        more: false,
    };
    assert_eq!(
        &encode(&frame)[..],
        &[0x1D, 0, 0, 0, 8, 0, 0, 1, 0, 3, b'a', b'/', b'b']
    );
    let frame = Frame::Removed {
        removed: 2,
        failures: vec![RemoveFailure {
            index: 1,
            code: ErrorCode::DENIED,
            message: "no".into(),
        }],
    };
    assert_eq!(
        &encode(&frame)[..],
        &[0x3C, 0, 0, 0, 12, 0, 2, 0, 1, 0, 1, 0, 15, 0, 2, b'n', b'o']
    );
    // More paths than a request may hold, a flag that is neither 0 nor 1, a path over
    // MAX_PATH, an index or count past the request's bound: refused, named.
    let many = Frame::RemoveRequest {
        paths: vec![String::new(); MAX_REMOVE_PATHS + 1],
        more: false,
    };
    assert!(matches!(
        decode(encode(&many)),
        Err(DecodeError::TooLong { field: "count", .. })
    ));
    assert!(matches!(
        Frame::decode(FrameType::REMOVE_REQUEST, Bytes::from_static(&[2, 0, 0])),
        Err(DecodeError::InvalidValue { field: "more", .. })
    ));
    let long = Frame::RemoveRequest {
        paths: vec!["p".repeat(MAX_PATH + 1)],
        more: false,
    };
    assert!(matches!(
        decode(encode(&long)),
        Err(DecodeError::TooLong { field: "path", .. })
    ));
    let bad_index = Frame::Removed {
        removed: 0,
        failures: vec![RemoveFailure {
            index: MAX_REMOVE_PATHS as u16,
            code: ErrorCode::IO,
            message: String::new(),
        }],
    };
    assert!(matches!(
        decode(encode(&bad_index)),
        Err(DecodeError::InvalidValue { field: "index", .. })
    ));
    let too_many = Frame::Removed {
        removed: MAX_REMOVE_PATHS as u16 + 1,
        failures: Vec::new(),
    };
    assert!(matches!(
        decode(encode(&too_many)),
        Err(DecodeError::InvalidValue {
            field: "removed",
            ..
        })
    ));
    // The longest request the bound allows still fits a control frame.
    let longest = Frame::RemoveRequest {
        paths: vec!["p".repeat(MAX_PATH); MAX_REMOVE_PATHS],
        more: true,
    };
    assert_eq!(decode(encode(&longest)), Ok(longest));
}

#[test]
fn pinned_copy_paths_and_the_only_flag_of_a_copy_request() {
    let frame = Frame::CopyPaths {
        paths: vec!["a/b".into()],
        more: true,
    };
    assert_eq!(
        &encode(&frame)[..],
        &[0x24, 0, 0, 0, 8, 1, 0, 1, 0, 3, b'a', b'/', b'b']
    );
    // `only` is one trailing byte, absent when unset: a plain copy's request is the one older
    // servers decode, and an older request decodes as a plain copy.
    let plain = encode(&Frame::CopyRequest(Box::new(sample_copy_request())));
    let only = CopyRequest {
        only: true,
        ..sample_copy_request()
    };
    let with_only = encode(&Frame::CopyRequest(Box::new(only.clone())));
    assert_eq!(with_only.len(), plain.len() + 1);
    assert_eq!(&with_only[5..plain.len()], &plain[5..]);
    assert_eq!(with_only[with_only.len() - 1], 1);
    assert_eq!(decode(with_only), Ok(Frame::CopyRequest(Box::new(only))));
    // A byte of unknown flags, or 0, is trailing: never read as a plain copy.
    for flags in [0, 8] {
        let mut p = payload_of(&Frame::CopyRequest(Box::new(sample_copy_request()))).to_vec();
        p.push(flags);
        assert!(matches!(
            Frame::decode(FrameType::COPY_REQUEST, Bytes::from(p)),
            Err(DecodeError::TrailingBytes { extra: 1, .. })
        ));
    }
    // More paths than a frame may hold, a bad flag: refused, named.
    let many = Frame::CopyPaths {
        paths: vec![String::new(); MAX_COPY_PATHS + 1],
        more: false,
    };
    assert!(matches!(
        decode(encode(&many)),
        Err(DecodeError::TooLong { field: "count", .. })
    ));
    assert!(matches!(
        Frame::decode(FrameType::COPY_PATHS, Bytes::from_static(&[2, 0, 0])),
        Err(DecodeError::InvalidValue { field: "more", .. })
    ));
}

#[test]
fn pinned_stripe_grant_request_and_a_striped_copy_request() {
    let frame = Frame::StripeGrantRequest { dest: "a/".into() };
    assert_eq!(&encode(&frame)[..], &[0x26, 0, 0, 0, 4, 0, 2, b'a', b'/']);
    // The stripe hosts follow the flags byte (bit 1), after `only`'s bit: count, then each
    // host's address, key and grant.
    let plain = encode(&Frame::CopyRequest(Box::new(sample_copy_request())));
    let striped = CopyRequest {
        only: true,
        stripes: vec![sample_copy_stripe()],
        ..sample_copy_request()
    };
    let bytes = encode(&Frame::CopyRequest(Box::new(striped.clone())));
    assert_eq!(&bytes[5..plain.len()], &plain[5..]);
    let mut tail = vec![3u8, 0, 1, 0, 9];
    tail.extend_from_slice(b"dtn3:7070");
    tail.extend_from_slice(&[0x3c; 32]);
    tail.extend_from_slice(&[0, 1, b's']);
    assert_eq!(&bytes[plain.len()..], &tail[..]);
    assert_eq!(decode(bytes), Ok(Frame::CopyRequest(Box::new(striped))));
    // The striped bit with no hosts, or more hosts than a request may name: refused, named.
    let mut p = payload_of(&Frame::CopyRequest(Box::new(sample_copy_request()))).to_vec();
    p.extend_from_slice(&[2, 0, 0]);
    assert!(matches!(
        Frame::decode(FrameType::COPY_REQUEST, Bytes::from(p)),
        Err(DecodeError::InvalidValue {
            field: "stripes",
            ..
        })
    ));
    let many = CopyRequest {
        stripes: vec![sample_copy_stripe(); MAX_COPY_STRIPES + 1],
        ..sample_copy_request()
    };
    assert!(matches!(
        decode(encode(&Frame::CopyRequest(Box::new(many)))),
        Err(DecodeError::TooLong {
            field: "stripes",
            ..
        })
    ));
}

#[test]
fn pinned_read_grant_request_and_a_pulled_copy_request() {
    let frame = Frame::ReadGrantRequest {
        src: "a".into(),
        stripe: true,
    };
    assert_eq!(&encode(&frame)[..], &[0x27, 0, 0, 0, 4, 0, 1, b'a', 1]);
    assert_eq!(decode(encode(&frame)), Ok(frame));
    assert!(matches!(
        Frame::decode(
            FrameType::READ_GRANT_REQUEST,
            Bytes::from_static(&[0, 1, b'a', 2])
        ),
        Err(DecodeError::InvalidValue {
            field: "stripe",
            ..
        })
    ));
    // `pull` is bit 2 of the flags byte; the source's stripe hosts follow as a push's do.
    let plain = encode(&Frame::CopyRequest(Box::new(sample_copy_request())));
    let pulled = CopyRequest {
        pull: true,
        ..sample_copy_request()
    };
    let bytes = encode(&Frame::CopyRequest(Box::new(pulled.clone())));
    assert_eq!(bytes.len(), plain.len() + 1);
    assert_eq!(bytes[bytes.len() - 1], 4);
    assert_eq!(decode(bytes), Ok(Frame::CopyRequest(Box::new(pulled))));
    let striped = CopyRequest {
        pull: true,
        stripes: vec![sample_copy_stripe()],
        ..sample_copy_request()
    };
    let bytes = encode(&Frame::CopyRequest(Box::new(striped.clone())));
    assert_eq!(bytes[plain.len()], 6);
    assert_eq!(decode(bytes), Ok(Frame::CopyRequest(Box::new(striped))));
}

#[test]
fn pinned_catalog_frames_and_their_limits() {
    let frame = Frame::CatalogRequest(CatalogRequest::Stat { path: "a".into() });
    assert_eq!(&encode(&frame)[..], &[0x1E, 0, 0, 0, 4, 1, 0, 1, b'a']);
    let frame = Frame::CatalogAnswer(CatalogAnswer::Done {
        entries: 1,
        objects: 2,
    });
    assert_eq!(
        &encode(&frame)[..],
        &[0x3D, 0, 0, 0, 17, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    );
    let refused = |ty: FrameType, payload: &'static [u8]| {
        Frame::decode(ty, Bytes::from_static(payload)).unwrap_err()
    };
    // An unknown op or tag, a flag that is neither 0 nor 1, a limit of 0: refused, named.
    assert!(matches!(
        refused(FrameType::CATALOG_REQUEST, &[0xFF, 0, 0]),
        DecodeError::InvalidValue { field: "op", .. }
    ));
    assert!(matches!(
        refused(FrameType::CATALOG_ANSWER, &[0]),
        DecodeError::InvalidValue { field: "tag", .. }
    ));
    assert!(matches!(
        refused(FrameType::CATALOG_REQUEST, &[2, 2, 0, 0]),
        DecodeError::InvalidValue {
            field: "recursive",
            ..
        }
    ));
    assert!(matches!(
        refused(FrameType::CATALOG_REQUEST, &[8, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        DecodeError::InvalidValue { field: "limit", .. }
    ));
    // `more` alone, without `last`, and unknown find parts.
    assert!(matches!(
        refused(FrameType::CATALOG_ANSWER, &[4, 2, 0, 0]),
        DecodeError::InvalidValue { field: "flags", .. }
    ));
    assert!(matches!(
        refused(FrameType::CATALOG_REQUEST, &[8, 0, 0, 0, 0, 0, 1, 0, 0, 8]),
        DecodeError::InvalidValue { field: "has", .. }
    ));
    // Metadata past its bounds, a find over its limit, too many conditions or objects.
    let long_attr = Frame::CatalogRequest(CatalogRequest::MetaSet {
        path: "a".into(),
        entry: MetaEntry {
            attr: "x".repeat(MAX_META_ATTR + 1),
            value: String::new(),
            unit: String::new(),
        },
    });
    assert!(matches!(
        decode(encode(&long_attr)),
        Err(DecodeError::TooLong { field: "attr", .. })
    ));
    let long_value = Frame::CatalogRequest(CatalogRequest::MetaSet {
        path: "a".into(),
        entry: MetaEntry {
            attr: "x".into(),
            value: "v".repeat(MAX_META_VALUE + 1),
            unit: String::new(),
        },
    });
    assert!(matches!(
        decode(encode(&long_value)),
        Err(DecodeError::TooLong { field: "value", .. })
    ));
    let find = |limit, conditions| {
        Frame::CatalogRequest(CatalogRequest::Find(Box::new(FindRequest {
            under: String::new(),
            conditions,
            name: None,
            newer_ns: None,
            larger: None,
            limit,
        })))
    };
    assert!(matches!(
        decode(encode(&find(MAX_FIND_LIMIT + 1, Vec::new()))),
        Err(DecodeError::InvalidValue { field: "limit", .. })
    ));
    let cond = FindCondition {
        compare: Compare::Eq,
        attr: "a".into(),
        value: "b".into(),
    };
    assert!(matches!(
        decode(encode(&find(1, vec![cond; MAX_FIND_CONDITIONS + 1]))),
        Err(DecodeError::TooLong {
            field: "conditions",
            ..
        })
    ));
    let many = Frame::CatalogAnswer(CatalogAnswer::Meta {
        entries: vec![
            MetaEntry {
                attr: "a".into(),
                value: String::new(),
                unit: String::new(),
            };
            MAX_META_ENTRIES + 1
        ],
    });
    assert!(matches!(
        decode(encode(&many)),
        Err(DecodeError::TooLong {
            field: "metadata",
            ..
        })
    ));
    // The largest answers the bounds allow still fit a control frame.
    let object = CatalogObject {
        path: "p".repeat(MAX_PATH),
        size: 0,
        mtime_ns: 0,
        digest: vec![0; MAX_DIGEST],
        algo: "a".repeat(MAX_ALGO),
        stored_by: "s".repeat(MAX_SERVER_NAME),
        stored_at: 0,
    };
    let found = Frame::CatalogAnswer(CatalogAnswer::Found {
        objects: vec![object.clone(); MAX_FOUND_ENTRIES],
        last: true,
        more: true,
    });
    assert_eq!(decode(encode(&found)), Ok(found));
    let entry = MetaEntry {
        attr: "a".repeat(MAX_META_ATTR),
        value: "v".repeat(MAX_META_VALUE),
        unit: "u".repeat(MAX_META_UNIT),
    };
    let replica = CatalogReplica {
        server: "s".repeat(MAX_SERVER_NAME),
        physical: "p".repeat(MAX_PHYSICAL),
        state: ReplicaHealth::Bad,
        address: "a".repeat(MAX_ADDRESS),
        path: "r".repeat(MAX_PATH),
    };
    let stat = Frame::CatalogAnswer(CatalogAnswer::Stat(Box::new(CatalogStat {
        object,
        replicas: vec![replica; MAX_REPLICAS],
        metadata: vec![entry; MAX_META_ENTRIES],
        policy: Some(CatalogPolicy {
            prefix: "x".repeat(MAX_PATH),
            replicas: u32::MAX,
            retain_s: u64::MAX,
            checksum: "c".repeat(MAX_ALGO),
            owed: Some(PolicyOwed {
                tries: u32::MAX,
                next_in_ms: u64::MAX,
                note: "n".repeat(MAX_POLICY_NOTE),
            }),
        }),
    })));
    assert_eq!(decode(encode(&stat)), Ok(stat));
}

#[test]
fn pinned_replica_address_frames() {
    // Locate is op 12; a record with an address op 13, without one op 11 as before.
    let frame = Frame::CatalogRequest(CatalogRequest::Locate { path: "a".into() });
    assert_eq!(&encode(&frame)[..], &[0x1E, 0, 0, 0, 4, 12, 0, 1, b'a']);
    let record = |address: &str| {
        Frame::CatalogRequest(CatalogRequest::Replicated {
            path: "a".into(),
            recursive: false,
            server: "b".into(),
            physical: "c".into(),
            address: address.into(),
            at: String::new(),
        })
    };
    assert_eq!(
        &encode(&record(""))[..],
        &[0x1E, 0, 0, 0, 11, 11, 0, 0, 1, b'a', 0, 1, b'b', 0, 1, b'c']
    );
    assert_eq!(
        &encode(&record("h:1"))[..],
        &[0x1E, 0, 0, 0, 16, 13, 0, 0, 1, b'a', 0, 1, b'b', 0, 1, b'c', 0, 3, b'h', b':', b'1']
    );
    let refused = |ty: FrameType, payload: &'static [u8]| {
        Frame::decode(ty, Bytes::from_static(payload)).unwrap_err()
    };
    // Op 13 with an empty address would be op 11's second encoding.
    assert!(matches!(
        refused(
            FrameType::CATALOG_REQUEST,
            &[13, 0, 0, 1, b'a', 0, 1, b'b', 0, 1, b'c', 0, 0]
        ),
        DecodeError::InvalidValue {
            field: "address",
            ..
        }
    ));
    // A stat's replicas carry addresses (tag 6) only when one has one.
    let object = CatalogObject {
        path: "a".into(),
        size: 1,
        mtime_ns: 2,
        digest: vec![3],
        algo: "blake3".into(),
        stored_by: "t".into(),
        stored_at: 4,
    };
    let stat = |address: &str| {
        Frame::CatalogAnswer(CatalogAnswer::Stat(Box::new(CatalogStat {
            object: object.clone(),
            replicas: vec![CatalogReplica {
                server: "b".into(),
                physical: "c".into(),
                state: ReplicaHealth::Good,
                address: address.into(),
                path: String::new(),
            }],
            metadata: Vec::new(),
            policy: None,
        })))
    };
    let without = encode(&stat(""));
    let with = encode(&stat("h:1"));
    assert_eq!(without[5], 2);
    assert_eq!(with[5], 6);
    assert_eq!(
        with.len(),
        without.len() + 5,
        "the address string alone is added"
    );
    assert_eq!(decode(with.clone()), Ok(stat("h:1")));
    // Tag 6 with every address empty: refused.
    let mut canonical = BytesMut::from(&without[..]);
    canonical[5] = 6;
    // The empty address (two zero bytes) after the replica's state byte.
    let state_at = without.len() - 2 - 1;
    let mut bytes = canonical[..=state_at].to_vec();
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(&canonical[state_at + 1..]);
    let len = (bytes.len() - 5) as u32;
    bytes[1..5].copy_from_slice(&len.to_be_bytes());
    assert!(matches!(
        decode(BytesMut::from(&bytes[..])),
        Err(DecodeError::InvalidValue { field: "tag", .. })
    ));
    let too_long = stat(&"h".repeat(MAX_ADDRESS + 1));
    assert!(decode(encode(&too_long)).is_err());
}

#[test]
fn pinned_replica_path_frames() {
    // A record of a copy at another path is op 14: its address (empty here) then its path.
    let record = |address: &str, at: &str| {
        Frame::CatalogRequest(CatalogRequest::Replicated {
            path: "a".into(),
            recursive: false,
            server: "b".into(),
            physical: "c".into(),
            address: address.into(),
            at: at.into(),
        })
    };
    assert_eq!(
        &encode(&record("", "d"))[..],
        &[0x1E, 0, 0, 0, 16, 14, 0, 0, 1, b'a', 0, 1, b'b', 0, 1, b'c', 0, 0, 0, 1, b'd']
    );
    assert_eq!(decode(encode(&record("h:1", "d"))), Ok(record("h:1", "d")));
    // Op 14 with an empty path would be op 11's or 13's second encoding.
    let refused = Frame::decode(
        FrameType::CATALOG_REQUEST,
        Bytes::from_static(&[14, 0, 0, 1, b'a', 0, 1, b'b', 0, 1, b'c', 0, 0, 0, 0]),
    )
    .unwrap_err();
    assert!(
        matches!(refused, DecodeError::InvalidValue { field: "at", .. }),
        "{refused:?}"
    );
    // A stat's replicas carry their paths (tag 7, with the addresses) only when one has one.
    let object = CatalogObject {
        path: "a".into(),
        size: 1,
        mtime_ns: 2,
        digest: vec![3],
        algo: "blake3".into(),
        stored_by: "t".into(),
        stored_at: 4,
    };
    let stat = |path: &str| {
        Frame::CatalogAnswer(CatalogAnswer::Stat(Box::new(CatalogStat {
            object: object.clone(),
            replicas: vec![CatalogReplica {
                server: "b".into(),
                physical: "c".into(),
                state: ReplicaHealth::Good,
                address: String::new(),
                path: path.into(),
            }],
            metadata: Vec::new(),
            policy: None,
        })))
    };
    let without = encode(&stat(""));
    let with = encode(&stat("x/a"));
    assert_eq!((without[5], with[5]), (2, 7));
    assert_eq!(
        with.len(),
        without.len() + 2 + 2 + 3,
        "an empty address and the path are added"
    );
    assert_eq!(decode(with.clone()), Ok(stat("x/a")));
    // Tag 7 with every path empty: refused (that is tag 2 or 6).
    let state_at = without.len() - 2 - 1;
    let mut bytes = without[..=state_at].to_vec();
    bytes[5] = 7;
    bytes.extend_from_slice(&[0, 0, 0, 0]);
    bytes.extend_from_slice(&without[state_at + 1..]);
    let len = (bytes.len() - 5) as u32;
    bytes[1..5].copy_from_slice(&len.to_be_bytes());
    assert!(matches!(
        decode(BytesMut::from(&bytes[..])),
        Err(DecodeError::InvalidValue { field: "tag", .. })
    ));
    assert!(decode(encode(&stat(&"r".repeat(MAX_PATH + 1)))).is_err());
}

#[test]
fn pinned_verify_frames_and_their_limits() {
    let frame = Frame::CatalogRequest(CatalogRequest::Verify {
        path: "a".into(),
        recursive: true,
    });
    assert_eq!(&encode(&frame)[..], &[0x1E, 0, 0, 0, 5, 9, 1, 0, 1, b'a']);
    let frame = Frame::CatalogAnswer(CatalogAnswer::Verified(Box::new(VerifyReport {
        counts: VerifyCounts {
            checked: 1,
            good: 0,
            bad: 1,
            missing: 0,
            unregistered: 0,
            bytes: 2,
        },
        problems: vec![(Problem::Bad, "a".into())],
        last: true,
        more: false,
    })));
    let mut want = vec![0x3D, 0, 0, 0, 56, 5, 1];
    for n in [1u64, 0, 1, 0, 0, 2] {
        want.extend(n.to_be_bytes());
    }
    want.extend([0, 1, 0, 0, 1, b'a']);
    assert_eq!(&encode(&frame)[..], &want[..]);
    let refused = |ty: FrameType, payload: &'static [u8]| {
        Frame::decode(ty, Bytes::from_static(payload)).unwrap_err()
    };
    assert!(matches!(
        refused(FrameType::CATALOG_REQUEST, &[9, 2, 0, 0]),
        DecodeError::InvalidValue {
            field: "recursive",
            ..
        }
    ));
    // `more` without `last`, an unknown problem, a count it does not hold, too many paths.
    assert!(matches!(
        refused(FrameType::CATALOG_ANSWER, &[5, 2]),
        DecodeError::InvalidValue { field: "flags", .. }
    ));
    let mut payload = vec![5, 1];
    payload.extend([0; 48]);
    payload.extend([0, 1, 7, 0, 0]);
    assert!(matches!(
        Frame::decode(FrameType::CATALOG_ANSWER, Bytes::from(payload)),
        Err(DecodeError::InvalidValue {
            field: "problem",
            ..
        })
    ));
    let mut payload = vec![5, 1];
    payload.extend([0; 48]);
    payload.extend([0xFF, 0xFF]);
    assert!(Frame::decode(FrameType::CATALOG_ANSWER, Bytes::from(payload)).is_err());
    let report = |problems| {
        Frame::CatalogAnswer(CatalogAnswer::Verified(Box::new(VerifyReport {
            counts: VerifyCounts::default(),
            problems,
            last: true,
            more: true,
        })))
    };
    let over = report(vec![
        (Problem::Missing, String::new());
        MAX_VERIFY_PROBLEMS + 1
    ]);
    assert!(matches!(
        decode(encode(&over)),
        Err(DecodeError::TooLong {
            field: "problems",
            ..
        })
    ));
    // The largest answer the bounds allow still fits a control frame.
    let longest = report(vec![
        (Problem::Bad, "p".repeat(MAX_PATH));
        MAX_VERIFY_PROBLEMS
    ]);
    assert_eq!(decode(encode(&longest)), Ok(longest));
}

/// A stat's policy is trailing and optional: a stat without one has the old layout, and a
/// policy's tag is 1 alone (an absent one is no bytes, so a 0 would not round-trip).
#[test]
fn a_stats_policy_is_trailing_and_optional() {
    let object = CatalogObject {
        path: "a".into(),
        size: 1,
        mtime_ns: 2,
        digest: vec![3; 32],
        algo: "blake3".into(),
        stored_by: "t".into(),
        stored_at: 4,
    };
    let bare = CatalogStat {
        object,
        replicas: Vec::new(),
        metadata: Vec::new(),
        policy: None,
    };
    let with = CatalogStat {
        policy: Some(CatalogPolicy {
            prefix: "raw".into(),
            replicas: 2,
            retain_s: 0,
            checksum: String::new(),
            owed: None,
        }),
        ..bare.clone()
    };
    let old = encode(&Frame::CatalogAnswer(CatalogAnswer::Stat(Box::new(
        bare.clone(),
    ))));
    let new = encode(&Frame::CatalogAnswer(CatalogAnswer::Stat(Box::new(
        with.clone(),
    ))));
    assert_eq!(
        &new[HEADER_LEN..old.len()],
        &old[HEADER_LEN..],
        "the old layout, then more"
    );
    assert_eq!(
        &new[old.len()..],
        &[1, 0, 3, b'r', b'a', b'w', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    let mut zero = old.clone();
    zero.extend_from_slice(&[0]);
    let len = (zero.len() - HEADER_LEN) as u32;
    zero[1..5].copy_from_slice(&len.to_be_bytes());
    assert!(decode(zero).is_err(), "a policy tag 0 is refused");
    assert_eq!(
        decode(new),
        Ok(Frame::CatalogAnswer(CatalogAnswer::Stat(Box::new(with))))
    );
}
