//! `/proc/interrupts` parsing and IRQ-affinity conflict detection (both pure, unit-tested).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::cpulist::format_cpulist;
use crate::host::{Nic, NicIrq, NumaNode};

/// One line of `/proc/interrupts`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct InterruptLine {
    /// The label before the colon: `"38"`, or `"LOC"`, `"NMI"`, … for architecture counters.
    pub label: String,
    /// The IRQ number when the label is one.
    pub irq: Option<u32>,
    /// Counts per CPU column (aligned with [`Interrupts::cpus`]); shorter when the kernel printed
    /// fewer columns (e.g. `ERR:`).
    pub counts: Vec<u64>,
    /// Interrupt chip, e.g. `"PCI-MSIX-0000:00:03.0"` or `"IR-PCI-MSI"` (numbered IRQs only).
    pub chip: Option<String>,
    /// Hardware IRQ and trigger type, e.g. `"1-edge"`.
    pub hwirq: Option<String>,
    /// The handlers' names, e.g. `["virtio2-input.0"]` or `["acpi", "ehci_hcd:usb1"]`.
    pub actions: Vec<String>,
    /// For architecture counters, their description (`"Local timer interrupts"`).
    pub description: Option<String>,
}

impl InterruptLine {
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// `/proc/interrupts`, parsed.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Interrupts {
    /// CPU numbers of the count columns, from the header (`CPU0 CPU2` → `[0, 2]`; offline CPUs
    /// have no column).
    pub cpus: Vec<usize>,
    pub lines: Vec<InterruptLine>,
}

impl Interrupts {
    /// The line of a numbered IRQ.
    pub fn irq(&self, irq: u32) -> Option<&InterruptLine> {
        self.lines.iter().find(|l| l.irq == Some(irq))
    }

    /// `(cpu, count)` of each CPU that handled this line at least once.
    pub fn cpus_with_counts(&self, line: &InterruptLine) -> Vec<(usize, u64)> {
        line.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .filter_map(|(i, &c)| self.cpus.get(i).map(|&cpu| (cpu, c)))
            .collect()
    }
}

fn is_trigger_token(t: &str) -> bool {
    let last = t.rsplit('-').next().unwrap_or(t);
    matches!(last, "edge" | "level" | "fasteoi" | "simple")
}

/// Parses the text of `/proc/interrupts`. Lines that do not parse are skipped.
pub fn parse_interrupts(text: &str) -> Interrupts {
    let mut lines_iter = text.lines();
    let mut out = Interrupts::default();
    let Some(header) = lines_iter.next() else {
        return out;
    };
    out.cpus = header
        .split_whitespace()
        .filter_map(|t| t.strip_prefix("CPU")?.parse().ok())
        .collect();
    let ncols = out.cpus.len();
    for line in lines_iter {
        let Some((label, rest)) = line.split_once(':') else {
            continue;
        };
        let label = label.trim().to_string();
        if label.is_empty() {
            continue;
        }
        let tokens: Vec<&str> = rest.split_whitespace().collect();
        let mut counts = Vec::with_capacity(ncols);
        let mut i = 0;
        while i < tokens.len() && counts.len() < ncols {
            match tokens[i].parse::<u64>() {
                Ok(c) => counts.push(c),
                Err(_) => break,
            }
            i += 1;
        }
        let tail = &tokens[i..];
        let irq = label.parse::<u32>().ok();
        let mut entry = InterruptLine {
            label,
            irq,
            counts,
            chip: None,
            hwirq: None,
            actions: Vec::new(),
            description: None,
        };
        if irq.is_none() {
            if !tail.is_empty() {
                entry.description = Some(tail.join(" "));
            }
        } else if !tail.is_empty() {
            let (chip_end, actions_start, hwirq) =
                match tail.iter().position(|t| is_trigger_token(t)) {
                    // "IO-APIC 2-edge timer", "PCI-MSIX-0000:00:03.0 1-edge virtio2-input.0":
                    // the chip, then hwirq-type, then the actions.
                    Some(p) if p >= 1 => (p, p + 1, Some(tail[p].to_string())),
                    // Old kernels: "PCI-MSI-edge eth0-TxRx-0".
                    Some(p) => (p + 1, p + 1, None),
                    // Unknown layout: the first token is the chip, the last the action.
                    None => (1, tail.len().saturating_sub(1).max(1), None),
                };
            entry.chip = Some(tail[..chip_end.min(tail.len())].join(" "));
            entry.hwirq = hwirq;
            if actions_start < tail.len() {
                entry.actions = tail[actions_start..]
                    .join(" ")
                    .split(',')
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty())
                    .collect();
            }
        }
        out.lines.push(entry);
    }
    out
}

/// What kind of IRQ-affinity problem a NIC has.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IrqConflictKind {
    /// The NIC sits on one NUMA node and its interrupts are handled only on CPUs of another:
    /// every packet crosses the interconnect.
    CrossNuma,
    /// Several active queue IRQs are handled by one and the same CPU while other CPUs (of the
    /// NIC's node, when known) handle none: that CPU caps the packet rate.
    Stacked,
}

/// An IRQ-affinity problem, with the IRQs and CPUs involved and a sentence saying what to do.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct IrqConflict {
    pub kind: IrqConflictKind,
    /// NIC names involved.
    pub nics: Vec<String>,
    pub irqs: Vec<u32>,
    pub cpus: Vec<usize>,
    pub text: String,
}

/// The CPUs that handle an IRQ: its effective affinity when the kernel reports one, else its
/// configured affinity, else the CPUs whose counters moved.
pub fn handling_cpus(irq: &NicIrq) -> Vec<usize> {
    if let Some(e) = irq.effective_affinity.as_ref().filter(|e| !e.is_empty()) {
        return e.clone();
    }
    if let Some(a) = irq.affinity.as_ref().filter(|a| !a.is_empty()) {
        return a.clone();
    }
    irq.per_cpu
        .iter()
        .filter(|(_, c)| *c > 0)
        .map(|&(cpu, _)| cpu)
        .collect()
}

/// Whether an IRQ carries packets (a queue that has fired), as opposed to a configuration or
/// management vector, or a queue never used.
pub fn is_active_queue(irq: &NicIrq) -> bool {
    let name = irq.name.as_deref().unwrap_or("");
    let mgmt = ["config", "async", "mgmt", "misc", "event", "ctrl", "lsc"]
        .iter()
        .any(|m| name.ends_with(m) || name.contains(&format!("-{m}")));
    irq.count > 0 && !mgmt
}

/// Finds IRQ-affinity conflicts of the NICs' interrupts. `online_cpus` are the CPUs that could
/// handle interrupts; `nodes` the NUMA nodes (conflicts across nodes need at least two).
pub fn irq_conflicts(nics: &[Nic], nodes: &[NumaNode], online_cpus: &[usize]) -> Vec<IrqConflict> {
    let mut out = Vec::new();
    let node_cpus = |n: u32| nodes.iter().find(|x| x.id == n).map(|x| &x.cpus);

    // Cross-NUMA handling.
    if nodes.len() > 1 {
        for nic in nics {
            let Some(node) = nic.numa_node else { continue };
            let Some(local) = node_cpus(node) else {
                continue;
            };
            let mut irqs = Vec::new();
            let mut cpus = BTreeSet::new();
            for irq in nic.irqs.iter().filter(|i| is_active_queue(i)) {
                let h = handling_cpus(irq);
                if !h.is_empty() && !h.iter().any(|c| local.contains(c)) {
                    irqs.push(irq.irq);
                    cpus.extend(h);
                }
            }
            if !irqs.is_empty() {
                let cpus: Vec<usize> = cpus.into_iter().collect();
                let list = irqs
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                out.push(IrqConflict {
                    kind: IrqConflictKind::CrossNuma,
                    nics: vec![nic.name.clone()],
                    text: format!(
                        "{} is on NUMA node {node} but IRQ{} {list} {} handled on CPUs {} only \
                         (not node {node}): every packet crosses the interconnect; point \
                         /proc/irq/N/smp_affinity_list at node {node}'s CPUs ({}) or let \
                         irqbalance do it",
                        nic.name,
                        if irqs.len() > 1 { "s" } else { "" },
                        if irqs.len() > 1 { "are" } else { "is" },
                        format_cpulist(&cpus),
                        format_cpulist(local),
                    ),
                    irqs,
                    cpus,
                });
            }
        }
    }

    // Several active queues stacked on one CPU while CPUs of the same node handle none.
    // Group by node (None = all online CPUs when the node is unknown or there is one node).
    let scope_of = |nic: &Nic| -> Option<u32> {
        if nodes.len() > 1 {
            nic.numa_node.filter(|&n| node_cpus(n).is_some())
        } else {
            None
        }
    };
    let mut scopes: BTreeMap<Option<u32>, Vec<(&Nic, &NicIrq)>> = BTreeMap::new();
    for nic in nics {
        for irq in nic.irqs.iter().filter(|i| is_active_queue(i)) {
            scopes.entry(scope_of(nic)).or_default().push((nic, irq));
        }
    }
    for (scope, irqs) in scopes {
        let scope_cpus: Vec<usize> = match scope {
            Some(n) => node_cpus(n).cloned().unwrap_or_default(),
            None => online_cpus.to_vec(),
        };
        // CPUs handling at least one queue IRQ, and the IRQs pinned to exactly one CPU.
        let mut busy: BTreeSet<usize> = BTreeSet::new();
        let mut single: BTreeMap<usize, Vec<(&Nic, &NicIrq)>> = BTreeMap::new();
        for &(nic, irq) in &irqs {
            let h = handling_cpus(irq);
            busy.extend(h.iter().copied());
            if let [cpu] = h[..] {
                single.entry(cpu).or_default().push((nic, irq));
            }
        }
        let idle: Vec<usize> = scope_cpus
            .iter()
            .copied()
            .filter(|c| !busy.contains(c))
            .collect();
        if idle.is_empty() {
            continue;
        }
        for (cpu, stacked) in single {
            if stacked.len() < 2 {
                continue;
            }
            let mut nics: Vec<String> = stacked.iter().map(|(n, _)| n.name.clone()).collect();
            nics.dedup();
            let irqs: Vec<u32> = stacked.iter().map(|(_, i)| i.irq).collect();
            let list = irqs
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            out.push(IrqConflict {
                kind: IrqConflictKind::Stacked,
                text: format!(
                    "CPU {cpu} handles {} queue IRQs of {} ({list}) while CPU{} {} handle{} \
                     none: that one CPU caps the packet rate; spread them over \
                     /proc/irq/N/smp_affinity_list or run irqbalance",
                    irqs.len(),
                    nics.join(", "),
                    if idle.len() > 1 { "s" } else { "" },
                    format_cpulist(&idle),
                    if idle.len() > 1 { "" } else { "s" },
                ),
                nics,
                irqs,
                cpus: vec![cpu],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "           CPU0       CPU1       CPU2       CPU3
  0:         39          0          0          0   IO-APIC   2-edge      timer
  9:          0          4          0          0   IO-APIC   9-fasteoi   acpi, ehci_hcd:usb1
 37:          0          0          0          0 PCI-MSIX-0000:00:03.0   0-edge      virtio2-config
 38:          0       5103          7          0 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 64:     812345          0          0          0  IR-PCI-MSI 524288-edge      eth0-TxRx-0
 65:          0          0          0          0  PCI-MSI-edge      eth1-rx-0
NMI:          0          0          0          0   Non-maskable interrupts
LOC:   11598912   11869513       3000       4000   Local timer interrupts
ERR:          0
MIS:          0
";

    #[test]
    fn parses_proc_interrupts() {
        let p = parse_interrupts(SAMPLE);
        assert_eq!(p.cpus, vec![0, 1, 2, 3]);
        assert_eq!(p.lines.len(), 10);

        let timer = p.irq(0).unwrap();
        assert_eq!(timer.counts, vec![39, 0, 0, 0]);
        assert_eq!(timer.chip.as_deref(), Some("IO-APIC"));
        assert_eq!(timer.hwirq.as_deref(), Some("2-edge"));
        assert_eq!(timer.actions, vec!["timer"]);

        let shared = p.irq(9).unwrap();
        assert_eq!(shared.actions, vec!["acpi", "ehci_hcd:usb1"]);

        let q = p.irq(38).unwrap();
        assert_eq!(q.chip.as_deref(), Some("PCI-MSIX-0000:00:03.0"));
        assert_eq!(q.actions, vec!["virtio2-input.0"]);
        assert_eq!(q.total(), 5110);
        assert_eq!(p.cpus_with_counts(q), vec![(1, 5103), (2, 7)]);

        let e = p.irq(64).unwrap();
        assert_eq!(e.chip.as_deref(), Some("IR-PCI-MSI"));
        assert_eq!(e.hwirq.as_deref(), Some("524288-edge"));
        assert_eq!(e.actions, vec!["eth0-TxRx-0"]);

        let old = p.irq(65).unwrap();
        assert_eq!(old.chip.as_deref(), Some("PCI-MSI-edge"));
        assert_eq!(old.hwirq, None);
        assert_eq!(old.actions, vec!["eth1-rx-0"]);

        let loc = p.lines.iter().find(|l| l.label == "LOC").unwrap();
        assert_eq!(loc.irq, None);
        assert_eq!(loc.counts, vec![11598912, 11869513, 3000, 4000]);
        assert_eq!(loc.description.as_deref(), Some("Local timer interrupts"));

        let err = p.lines.iter().find(|l| l.label == "ERR").unwrap();
        assert_eq!(err.counts, vec![0]);
        assert_eq!(err.description, None);
    }

    #[test]
    fn header_with_offline_cpus() {
        let p = parse_interrupts("     CPU0   CPU2\n 5:  1  2  X 5-edge foo\n");
        assert_eq!(p.cpus, vec![0, 2]);
        assert_eq!(p.cpus_with_counts(p.irq(5).unwrap()), vec![(0, 1), (2, 2)]);
        assert_eq!(parse_interrupts(""), Interrupts::default());
    }

    fn irq(n: u32, name: &str, eff: &[usize], count: u64) -> NicIrq {
        NicIrq {
            irq: n,
            name: Some(name.into()),
            affinity: Some(vec![0, 1, 2, 3, 4, 5, 6, 7]),
            effective_affinity: Some(eff.to_vec()),
            count,
            per_cpu: eff.iter().map(|&c| (c, count)).collect(),
        }
    }

    fn nic(name: &str, node: Option<u32>, irqs: Vec<NicIrq>) -> Nic {
        Nic {
            name: name.into(),
            is_virtual: false,
            numa_node: node,
            irqs,
            ..Nic::default()
        }
    }

    fn two_nodes() -> Vec<NumaNode> {
        vec![
            NumaNode {
                id: 0,
                cpus: vec![0, 1, 2, 3],
                mem_total: None,
            },
            NumaNode {
                id: 1,
                cpus: vec![4, 5, 6, 7],
                mem_total: None,
            },
        ]
    }

    #[test]
    fn detects_cross_numa_handling() {
        let nics = vec![nic(
            "eth0",
            Some(1),
            vec![
                irq(40, "eth0-TxRx-0", &[4], 100),
                irq(41, "eth0-TxRx-1", &[0], 100),
                irq(42, "eth0-TxRx-2", &[1], 100),
                irq(43, "eth0-config", &[0], 100), // a management vector: ignored
                irq(44, "eth0-TxRx-3", &[2], 0),   // never fired: ignored
            ],
        )];
        let all: Vec<usize> = (0..8).collect();
        let c = irq_conflicts(&nics, &two_nodes(), &all);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].kind, IrqConflictKind::CrossNuma);
        assert_eq!(c[0].irqs, vec![41, 42]);
        assert_eq!(c[0].cpus, vec![0, 1]);
        assert!(c[0].text.contains("NUMA node 1"), "{}", c[0].text);
        assert!(c[0].text.contains("4-7"), "{}", c[0].text);

        // One node: no cross-NUMA conflict possible.
        let one = vec![NumaNode {
            id: 0,
            cpus: all.clone(),
            mem_total: None,
        }];
        let nics = vec![nic("eth0", Some(0), vec![irq(40, "eth0-TxRx-0", &[4], 1)])];
        assert!(irq_conflicts(&nics, &one, &all).is_empty());
    }

    #[test]
    fn detects_stacked_queues() {
        let all: Vec<usize> = (0..4).collect();
        let nics = vec![nic(
            "eth0",
            None,
            vec![
                irq(40, "eth0-TxRx-0", &[0], 10),
                irq(41, "eth0-TxRx-1", &[0], 10),
                irq(42, "eth0-TxRx-2", &[0], 10),
                irq(43, "eth0-TxRx-3", &[1], 10),
            ],
        )];
        let c = irq_conflicts(&nics, &[], &all);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].kind, IrqConflictKind::Stacked);
        assert_eq!(c[0].irqs, vec![40, 41, 42]);
        assert_eq!(c[0].cpus, vec![0]);
        assert!(c[0].text.contains("CPUs 2-3 handle none"), "{}", c[0].text);

        // Two queues per CPU with every CPU busy is fine.
        let nics = vec![nic(
            "eth0",
            None,
            (0..8)
                .map(|i| irq(40 + i, &format!("eth0-TxRx-{i}"), &[i as usize % 4], 5))
                .collect(),
        )];
        assert!(irq_conflicts(&nics, &[], &all).is_empty());

        // Queues of two NICs stacked on one CPU count together.
        let nics = vec![
            nic("eth0", None, vec![irq(40, "eth0-rx", &[3], 5)]),
            nic("eth1", None, vec![irq(50, "eth1-rx", &[3], 5)]),
        ];
        let c = irq_conflicts(&nics, &[], &all);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].nics, vec!["eth0", "eth1"]);

        // Per node: stacked on node 1 while node 1 has idle CPUs.
        let nics = vec![nic(
            "eth0",
            Some(1),
            vec![
                irq(40, "eth0-TxRx-0", &[5], 10),
                irq(41, "eth0-TxRx-1", &[5], 10),
            ],
        )];
        let c = irq_conflicts(&nics, &two_nodes(), &(0..8).collect::<Vec<_>>());
        assert_eq!(c.len(), 1);
        assert!(
            c[0].text.contains("CPUs 4,6-7 handle none"),
            "{}",
            c[0].text
        );
    }

    #[test]
    fn handling_falls_back_to_counts() {
        let mut i = irq(40, "eth0-rx", &[], 10);
        i.effective_affinity = None;
        i.affinity = None;
        i.per_cpu = vec![(0, 0), (3, 10)];
        assert_eq!(handling_cpus(&i), vec![3]);
    }
}
