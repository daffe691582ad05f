//! Runs a probe and prints its text report:
//! `cargo run --release -p ferry-probe --example probe -- host [--quick] [--json]`
//! `cargo run --release -p ferry-probe --example probe -- disk PATH [--quick|--full] [--json]`
//! Progress goes to stderr.

use ferry_probe::disk::{probe_disk, DiskOptions};
use ferry_probe::host::{probe_host, HostOptions};
use ferry_probe::ProbeProgress;

struct Stderr;

impl ProbeProgress for Stderr {
    fn on_step(&self, what: &str) {
        eprintln!("  … {what}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let positional: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    match positional.first().map(|s| s.as_str()) {
        Some("host") => {
            let opts = if flag("--quick") {
                HostOptions::quick()
            } else {
                HostOptions::default()
            };
            let rep = probe_host(&opts, &Stderr);
            if flag("--json") {
                println!("{}", serde_json::to_string_pretty(&rep).unwrap());
            } else {
                print!("{}", rep.render_text());
            }
        }
        Some("disk") => {
            let Some(path) = positional.get(1) else {
                eprintln!("usage: probe disk PATH [--quick|--full] [--json]");
                std::process::exit(2);
            };
            let opts = if flag("--quick") {
                DiskOptions::quick()
            } else if flag("--full") {
                DiskOptions::full()
            } else {
                DiskOptions::default()
            };
            match probe_disk(std::path::Path::new(path), &opts, &Stderr) {
                Ok(rep) if flag("--json") => {
                    println!("{}", serde_json::to_string_pretty(&rep).unwrap())
                }
                Ok(rep) => print!("{}", rep.render_text()),
                Err(e) => {
                    eprintln!("probe disk: {e}");
                    std::process::exit(1);
                }
            }
        }
        _ => {
            eprintln!(
                "usage: probe host [--quick] [--json] | probe disk PATH [--quick|--full] [--json]"
            );
            std::process::exit(2);
        }
    }
}
