//! What limited a transfer, from the loads both ends measured.

use ferry_proto::Load;

/// What limited a transfer, from both ends' loads (`None`: that end's report did not arrive).
/// `same_host`: both ends share the cores (loopback), so their CPU adds up.
pub fn bottleneck(sender: Option<Load>, receiver: Option<Load>, same_host: bool) -> &'static str {
    let f = |x: u16| f64::from(x.min(1000)) / 1000.0;
    let cpu: Vec<f64> = [sender, receiver]
        .iter()
        .flatten()
        .map(|l| f(l.cpu_permille))
        .collect();
    let busiest = cpu.iter().copied().fold(0.0, f64::max);
    let together: f64 = cpu.iter().sum();
    if busiest >= 0.9 || (same_host && together >= 0.9) {
        "cpu"
    } else if sender.is_some_and(|l| f(l.starved_permille) >= 0.5) {
        "source storage"
    } else if receiver.is_some_and(|l| f(l.blocked_permille) >= 0.5) {
        "destination storage"
    } else {
        "network"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(cpu: u16, starved: u16, blocked: u16) -> Load {
        Load {
            cpu_permille: cpu,
            starved_permille: starved,
            blocked_permille: blocked,
            threads: 0,
        }
    }

    #[test]
    fn bottleneck_follows_the_measurements() {
        let idle = load(200, 0, 0);
        assert_eq!(bottleneck(Some(idle), Some(idle), false), "network");
        assert_eq!(bottleneck(Some(load(950, 0, 0)), Some(idle), false), "cpu");
        assert_eq!(
            bottleneck(Some(idle), Some(load(930, 0, 900)), false),
            "cpu"
        );
        assert_eq!(
            bottleneck(Some(load(500, 0, 0)), Some(load(450, 0, 0)), false),
            "network"
        );
        assert_eq!(
            bottleneck(Some(load(500, 0, 0)), Some(load(450, 0, 0)), true),
            "cpu"
        );
        assert_eq!(
            bottleneck(Some(load(300, 700, 0)), Some(idle), false),
            "source storage"
        );
        assert_eq!(
            bottleneck(Some(load(300, 0, 990)), Some(load(300, 0, 800)), false),
            "destination storage"
        );
        // The sender's queue full while the receiver keeps up: the path between them.
        assert_eq!(
            bottleneck(Some(load(300, 0, 990)), Some(load(300, 800, 0)), false),
            "network"
        );
        // A missing report is no evidence; out-of-range values are clamped.
        assert_eq!(bottleneck(None, None, false), "network");
        assert_eq!(bottleneck(None, Some(load(u16::MAX, 0, 0)), false), "cpu");
    }
}
