//! `ndd bench peers`: one listener, many peers (issue 34 item 2). N device sides, each with
//! an input-like stream (64 B at 1 kHz, lossy, high priority), into one app side with
//! `link.peers = N`; beside it in the same run one device side into one app side, and the N
//! device sides into N app side processes (one listener each: what serving N peers took
//! before). Per row: one-way latency p50 (median over the peers) and p99 (the worst peer), the
//! share of frames delivered, and the CPU the app side(s) and the device sides used, read from
//! `/proc` (user + system time over the run's wall time).

use super::fanout::{spawn, wait};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Row {
    name: String,
    peers: usize,
    app_processes: usize,
    p50_ms: f64,
    p99_ms: f64,
    delivered: f64,
    app_cpu: f64,
    dev_cpu: f64,
}

/// User + system CPU seconds of a running process so far.
fn cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After the command's closing parenthesis: fields 3.. (utime is field 14, stime 15).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // /proc counts in USER_HZ, which Linux fixes at 100 for user space on every architecture.
    ticks / 100.0
}

fn config(dir: &Path, peers: usize, count: u64) -> Result<PathBuf> {
    let p = dir.join(format!("peers-{peers}.toml"));
    std::fs::write(
        &p,
        format!(
            "driver = \"peersbench\"\n[link]\npeers = {peers}\nconnect_timeout_ms = 30000\n\n[[stream]]\nname = \"input\"\ndirection = \"device-to-app\"\nreliability = \"lossy\"\npriority = \"high\"\nsource = {{ type = \"synthetic\", size = 64, interval_ms = 1.0, count = {count}, seed = 1 }}\nsink = {{ type = \"null\" }}\n"
        ),
    )?;
    Ok(p)
}

/// `(p50 median, p99 worst, delivered share)` over every sink stream in the stats files.
fn latency(files: &[PathBuf], peers: usize, count: u64) -> Result<(f64, f64, f64)> {
    let mut p50s = Vec::new();
    let (mut p99, mut frames) = (0f64, 0u64);
    for f in files {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?,
        )?;
        for s in v["streams"].as_array().into_iter().flatten() {
            frames += s["frames"].as_u64().unwrap_or(0);
            if let Some(x) = s["latency_p50_ms"].as_f64() {
                p50s.push(x);
            }
            p99 = p99.max(s["latency_p99_ms"].as_f64().unwrap_or(0.0));
        }
    }
    p50s.sort_by(f64::total_cmp);
    let p50 = p50s.get(p50s.len() / 2).copied().unwrap_or(f64::NAN);
    Ok((p50, p99, frames as f64 / (count as f64 * peers as f64)))
}

/// `peers` device sides into `apps` app side processes (1: one listener with `link.peers`;
/// `peers`: one listener each, on its own port).
#[allow(clippy::too_many_arguments)]
fn row(
    exe: &Path,
    dir: &Path,
    app_home: &Path,
    devs: &[PathBuf],
    peers: usize,
    apps: usize,
    count: u64,
    port: u16,
) -> Result<Row> {
    let cfg = config(dir, if apps == 1 { peers } else { 1 }, count)?;
    let cfg_s = cfg.to_string_lossy().to_string();
    let mut app_children = Vec::new();
    let mut files = Vec::new();
    for a in 0..apps {
        let f = dir.join(format!("app-{peers}-{apps}-{a}.json"));
        let _ = std::fs::remove_file(&f);
        let args: Vec<String> = [
            "run",
            &cfg_s,
            "--side",
            "app",
            "--once",
            "--home",
            &app_home.to_string_lossy(),
            "--listen",
            &format!("127.0.0.1:{}", port + a as u16),
            "--stats-json",
            &f.to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        app_children.push(spawn(exe, &a)?);
        files.push(f);
    }
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let mut devices = Vec::new();
    for (i, d) in devs.iter().take(peers).enumerate() {
        let to = port + if apps == 1 { 0 } else { i as u16 };
        let args: Vec<String> = [
            "run",
            &cfg_s,
            "--side",
            "device",
            "--once",
            "--home",
            &d.to_string_lossy(),
            "--connect",
            &format!("127.0.0.1:{to}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        devices.push(spawn(exe, &a)?);
    }
    // CPU read just before each process ends: sampled while the devices run.
    let limit = Duration::from_secs(count / 1000 + 60);
    let mut app_cpu = vec![0f64; apps];
    let mut dev_cpu = vec![0f64; peers];
    loop {
        for (c, v) in app_children.iter().zip(app_cpu.iter_mut()) {
            let x = cpu_s(c.id());
            if x > 0.0 {
                *v = x;
            }
        }
        for (c, v) in devices.iter_mut().zip(dev_cpu.iter_mut()) {
            let x = cpu_s(c.id());
            if x > 0.0 {
                *v = x;
            }
        }
        let done = devices
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(Some(_))));
        if done || t0.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let wall = t0.elapsed().as_secs_f64();
    for (i, c) in devices.into_iter().enumerate() {
        wait(c, &format!("device side {i}"), Duration::from_secs(10))?;
    }
    for (i, c) in app_children.into_iter().enumerate() {
        wait(c, &format!("app side {i}"), Duration::from_secs(30))?;
    }
    let (p50, p99, delivered) = latency(&files, peers, count)?;
    Ok(Row {
        name: match (peers, apps) {
            (1, 1) => "one device side, one app side".into(),
            (_, 1) => format!("{peers} device sides, one app side (link.peers = {peers})"),
            _ => format!("{peers} device sides, {apps} app side processes (one each)"),
        },
        peers,
        app_processes: apps,
        p50_ms: p50,
        p99_ms: p99,
        delivered,
        app_cpu: app_cpu.iter().sum::<f64>() / wall * 100.0,
        dev_cpu: dev_cpu.iter().sum::<f64>() / wall * 100.0,
    })
}

pub fn run(quick: bool, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let exe = super::ndd_exe()?;
    let dir = std::env::temp_dir().join(format!("ndd-bench-peers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let n = if quick { 4 } else { 32 };
    let secs = if quick { 2 } else { 10 };
    let count = secs * 1000;
    let app = dir.join("app");
    let afp = super::ndd_ok(&exe, &["id", "--home", &app.to_string_lossy()])?;
    let mut devs = Vec::new();
    for i in 0..n {
        let d = dir.join(format!("dev{i}"));
        let dfp = super::ndd_ok(&exe, &["id", "--home", &d.to_string_lossy()])?;
        super::ndd_ok(&exe, &["trust", &afp, "--home", &d.to_string_lossy()])?;
        super::ndd_ok(
            &exe,
            &[
                "trust",
                &dfp,
                "--name",
                &format!("dev{i}"),
                "--home",
                &app.to_string_lossy(),
            ],
        )?;
        devs.push(d);
    }
    let port = 7930;
    let mut rows = Vec::new();
    eprintln!("peers: one device side…");
    rows.push(row(&exe, &dir, &app, &devs, 1, 1, count, port)?);
    eprintln!("peers: {n} device sides into one app side…");
    rows.push(row(&exe, &dir, &app, &devs, n, 1, count, port)?);
    eprintln!("peers: {n} device sides into {n} app side processes…");
    rows.push(row(&exe, &dir, &app, &devs, n, n, count, port + 100)?);
    let md = report(&rows, quick, secs);
    print!("{md}");
    std::fs::write(out.join("peers.md"), &md)?;
    eprintln!("wrote {}", out.join("peers.md").display());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn report(rows: &[Row], quick: bool, secs: u64) -> String {
    let mut md = format!(
        "# One listener, many peers\n\n`ndd bench peers{}` on this machine ({} cores), all processes on loopback over TLS: each device side sends an input-like stream (64 B every 1 ms, lossy, high priority, {secs} s) to the app side. Latency is one-way, source timestamp to the app side's sink (p50: the median peer's; p99: the worst peer's); CPU is user + system time of the processes over the run's wall time (100 % = one core).\n\n",
        if quick { " --quick" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    md += "| run | device sides | app side processes | p50 ms | p99 ms | delivered | app side(s) CPU | device sides CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        md += &format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.1} % | {:.1} % | {:.1} % |\n",
            r.name,
            r.peers,
            r.app_processes,
            r.p50_ms,
            r.p99_ms,
            r.delivered * 100.0,
            r.app_cpu,
            r.dev_cpu
        );
    }
    md
}
