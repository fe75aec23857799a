//! The deploy files (`deploy/systemd`, `deploy/kubernetes`) agree with the `nodus` flags they
//! pass, and the systemd setup works with the real binary.
//!
//! - The Kubernetes manifests are parsed: probes, scrape annotations, the grace period and the
//!   Service are checked against the container's own arguments.
//! - The unit files are read as INI: the notify protocol, reload, stop and restart settings.
//! - The stop timeouts (`TimeoutStopSec=`, `terminationGracePeriodSeconds` less the `preStop`
//!   sleep) are above the bound the arguments give a stop, its exit's flush included
//!   (deploy/README.md, Stop time).
//! - `systemd-analyze verify` and `systemd-analyze security --offline=true` check the units
//!   without a running systemd (they work in a container whose PID 1 is not systemd).
//! - `nodus serve` runs under `systemd-socket-activate` with the two named sockets the units
//!   declare, and a Unix datagram socket of the test's own as `NOTIFY_SOCKET`.
//!
//! The tests that need systemd's tools (Debian package `systemd`) fail when `CI` is set and they
//! are missing, and are skipped otherwise. Every process started is stopped by PID.

mod common;

use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use common::http::get;
use common::{NODUS, have};
use nodus_testkit::net::free_addrs;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;
use yaml_rust2::{Yaml, YamlLoader};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The value of `--name VALUE` or `--name=VALUE` among a command's own arguments (before `--`).
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let mut own = args.iter().take_while(|a| *a != "--");
    while let Some(arg) = own.next() {
        if arg == name {
            return own.next().map(String::as_str);
        }
        if let Some(v) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            return Some(v);
        }
    }
    None
}

/// A `nodus serve` seconds flag, or its default when absent.
fn seconds(args: &[String], name: &str, default: f64) -> f64 {
    flag(args, name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} {v:?} is not seconds"))
    })
}

/// How long a stop of `nodus serve` takes past `--shutdown-delay` + `--drain-timeout`, its exit
/// included: a cluster's workers are SIGKILLed 5 s past the drain deadline, and the exit (the
/// flush of queued output to a stalled journal included) fits in 3 s more
/// (`serve::app::stop_bound`; `tests/stderr.rs` holds the binary to it).
const SERVE_STOP_MARGIN: f64 = 8.0;

/// How long a stop of `nodus run` takes past twice `--kill-timeout` (the workers, then what they
/// left behind), its exit included (`EXIT_MARGIN` in `main.rs`; `tests/stderr.rs` holds the
/// binary to it).
const RUN_EXIT_MARGIN: f64 = 3.0;

/// The bound of a stop of `nodus serve ARGS` (deploy/README.md, Stop time), in seconds.
fn serve_stop_bound(args: &[String]) -> f64 {
    seconds(args, "--shutdown-delay", 0.0)
        + seconds(args, "--drain-timeout", 10.0)
        + SERVE_STOP_MARGIN
}

/// The bound of a stop of `nodus run ARGS` (deploy/README.md, Stop time), in seconds.
fn run_stop_bound(args: &[String]) -> f64 {
    2.0 * seconds(args, "--kill-timeout", 10.0) + RUN_EXIT_MARGIN
}

fn port_of(addr: &str) -> i64 {
    let addr: SocketAddr = addr
        .parse()
        .unwrap_or_else(|_| panic!("{addr:?} is not IP:PORT"));
    i64::from(addr.port())
}

// ---- systemd unit files ----

/// One unit file's assignments in order, as `(section, key, value)`.
struct Unit {
    name: String,
    settings: Vec<(String, String, String)>,
}

impl Unit {
    /// Reads `deploy/systemd/NAME`: sections, `Key=Value`, `#`/`;` comments, `\` continuations.
    fn read(name: &str) -> Unit {
        let text = std::fs::read_to_string(deploy_dir().join("systemd").join(name)).unwrap();
        let (mut section, mut settings, mut pending) = (String::new(), Vec::new(), String::new());
        for line in text.lines().map(str::trim) {
            if pending.is_empty() && (line.is_empty() || line.starts_with(['#', ';'])) {
                continue;
            }
            if let Some(cont) = line.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            let full = std::mem::take(&mut pending) + line;
            if let Some(s) = full.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                section = s.to_owned();
            } else {
                let (key, value) = full
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{name}: not Key=Value: {full:?}"));
                settings.push((section.clone(), key.trim().into(), value.trim().into()));
            }
        }
        Unit {
            name: name.to_owned(),
            settings,
        }
    }

    /// The last assignment of a single-valued setting.
    fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.settings
            .iter()
            .rev()
            .find(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
    }

    fn require(&self, section: &str, key: &str) -> &str {
        self.get(section, key)
            .unwrap_or_else(|| panic!("{}: no {key}= in [{section}]", self.name))
    }

    /// Every item of a list setting (space-separated, accumulated; an empty assignment resets).
    fn list(&self, section: &str, key: &str) -> Vec<String> {
        let mut items = Vec::new();
        for (_, _, v) in self
            .settings
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
        {
            if v.is_empty() {
                items.clear();
            }
            items.extend(v.split_whitespace().map(str::to_owned));
        }
        items
    }

    fn command(&self, key: &str) -> Vec<String> {
        self.require("Service", key)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }
}

/// `TimeoutStopSec=` in seconds: a plain number, or values with `s`/`min` units.
fn systemd_seconds(value: &str) -> f64 {
    value
        .split_whitespace()
        .map(|part| {
            let (num, unit) =
                part.split_at(part.find(|c: char| c.is_alphabetic()).unwrap_or(part.len()));
            let n: f64 = num.parse().unwrap_or_else(|_| panic!("time {value:?}"));
            match unit {
                "" | "s" | "sec" => n,
                "min" | "m" => n * 60.0,
                other => panic!("time unit {other:?} in {value:?}"),
            }
        })
        .sum()
}

/// The checks both services share: notify protocol, reload, stop, restart on exit 75.
fn check_service(service: &Unit, subcommand: &str) -> Vec<String> {
    assert_eq!(service.get("Service", "Type"), Some("notify"));
    assert_eq!(
        service.get("Service", "NotifyAccess"),
        Some("main"),
        "only the primary may notify"
    );
    let exec = service.command("ExecStart");
    assert_eq!(exec[0], "/usr/local/bin/nodus");
    assert_eq!(exec[1], subcommand);
    let reload = service.command("ExecReload");
    assert!(
        reload[0].ends_with("/kill")
            && reload
                .iter()
                .any(|w| ["-HUP", "-SIGHUP", "HUP"].contains(&w.as_str()))
            && reload.last().map(String::as_str) == Some("$MAINPID"),
        "ExecReload must send SIGHUP to the primary: {reload:?}"
    );
    assert_eq!(
        service.get("Service", "KillMode"),
        Some("mixed"),
        "SIGTERM to the primary only"
    );
    assert!(
        matches!(
            service.get("Service", "KillSignal"),
            None | Some("SIGTERM" | "TERM")
        ),
        "the stop signal is SIGTERM"
    );
    let restart = service.get("Service", "Restart").unwrap_or("no");
    let forced = service.list("Service", "RestartForceExitStatus");
    assert!(
        ["on-failure", "always"].contains(&restart) || forced.iter().any(|c| c == "75"),
        "exit 75 (restart budget spent) must make systemd restart the service: Restart={restart}"
    );
    for key in ["SuccessExitStatus", "RestartPreventExitStatus"] {
        assert!(
            !service.list("Service", key).iter().any(|c| c == "75"),
            "{key}= lists 75, so the give-up exit would not be restarted"
        );
    }
    assert_eq!(service.get("Service", "NoNewPrivileges"), Some("yes"));
    assert_eq!(service.get("Service", "ProtectSystem"), Some("strict"));
    assert!(
        service.get("Service", "DynamicUser") == Some("yes")
            || service.get("Service", "User").is_some(),
        "runs as an unprivileged user"
    );
    exec
}

#[test]
fn systemd_serve_units_notify_reload_drain_and_restart() {
    let service = Unit::read("nodus-serve.service");
    let exec = check_service(&service, "serve");
    assert_eq!(flag(&exec, "--workers"), Some("2"));
    let stop = serve_stop_bound(&exec);
    let timeout = systemd_seconds(service.require("Service", "TimeoutStopSec"));
    assert!(
        timeout > stop,
        "TimeoutStopSec={timeout} does not cover the stop: shutdown delay + drain + \
         {SERVE_STOP_MARGIN} s for the workers' kill and the exit's flush ({stop} s)"
    );

    // The sockets: one public, one named admin on loopback, both activating this service.
    let sockets = service.list("Service", "Sockets");
    let required = service.list("Unit", "Requires");
    let mut names = Vec::new();
    for socket in &sockets {
        assert!(required.contains(socket), "Requires= lacks {socket}");
        let unit = Unit::read(socket);
        assert_eq!(unit.get("Socket", "Service"), Some("nodus-serve.service"));
        names.push((
            unit.get("Socket", "FileDescriptorName").map(str::to_owned),
            unit.require("Socket", "ListenStream").to_owned(),
        ));
    }
    let admin = names
        .iter()
        .find(|(n, _)| n.as_deref() == Some("admin"))
        .expect("a socket named admin (the admin listener)");
    assert!(
        admin.1.starts_with("127.0.0.1:"),
        "the admin socket is loopback only: {}",
        admin.1
    );
    assert!(
        names.iter().any(|(n, _)| n.as_deref() != Some("admin")),
        "a public socket"
    );
}

#[test]
fn systemd_run_units_notify_reload_drain_and_restart() {
    let service = Unit::read("nodus-run.service");
    let exec = check_service(&service, "run");
    let program = exec
        .iter()
        .position(|a| a == "--")
        .expect("`-- CMD` in ExecStart");
    assert!(program + 1 < exec.len(), "no program after `--`");
    for budget in ["--max-restarts", "--restart-window"] {
        let v = flag(&exec, budget).unwrap_or_else(|| panic!("ExecStart lacks {budget}"));
        assert!(v.parse::<u32>().is_ok(), "{budget} {v:?}");
    }
    // The socket named like the service is its listener.
    let socket = Unit::read("nodus-run.socket");
    assert!(socket.get("Socket", "ListenStream").is_some());
    assert!(
        service
            .list("Unit", "Requires")
            .contains(&"nodus-run.socket".to_owned())
    );
    let stop = run_stop_bound(&exec);
    let timeout = systemd_seconds(service.require("Service", "TimeoutStopSec"));
    assert!(
        timeout > stop,
        "TimeoutStopSec={timeout} does not cover the stop: twice the kill timeout (the workers, \
         what they left behind) + {RUN_EXIT_MARGIN} s for the exit's flush ({stop} s)"
    );
}

// ---- Kubernetes manifests ----

/// `deploy/kubernetes/NAME`'s Deployment and Service.
fn manifest(name: &str) -> (Yaml, Yaml) {
    let text = std::fs::read_to_string(deploy_dir().join("kubernetes").join(name)).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let of_kind = |kind: &str| {
        let found: Vec<&Yaml> = docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some(kind))
            .collect();
        assert_eq!(found.len(), 1, "{name}: one {kind}");
        found[0].clone()
    };
    let (deployment, service) = (of_kind("Deployment"), of_kind("Service"));
    assert_eq!(deployment["apiVersion"].as_str(), Some("apps/v1"));
    assert_eq!(service["apiVersion"].as_str(), Some("v1"));
    (deployment, service)
}

fn string(y: &Yaml, what: &str) -> String {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} must be a string (quote it): {y:?}"))
        .to_owned()
}

fn strings(y: &Yaml, what: &str) -> Vec<String> {
    y.as_vec()
        .unwrap_or_else(|| panic!("{what} is not a list"))
        .iter()
        .map(|a| string(a, what))
        .collect()
}

/// A probe's or Service's port: a number, or a container port's name.
fn resolve_port(port: &Yaml, container: &Yaml) -> i64 {
    if let Some(n) = port.as_i64() {
        return n;
    }
    let name = string(port, "port");
    container["ports"]
        .as_vec()
        .into_iter()
        .flatten()
        .find(|p| p["name"].as_str() == Some(&name))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

/// A Deployment's one container, its pod spec and the container's arguments.
struct Pod {
    container: Yaml,
    spec: Yaml,
    args: Vec<String>,
}

/// The checks every manifest shares: `ports(args)` gives the (public, admin) ports the container
/// listens on; the probes have these paths on the admin port, the scrape annotations point at the
/// admin port and `metrics_path`, requests are set, the Service selects the pods and publishes the
/// public port and not the admin one.
fn check_deployment(
    (deployment, service): &(Yaml, Yaml),
    subcommand: &str,
    ports: impl Fn(&[String]) -> (i64, i64),
    probe_paths: (&str, &str),
    metrics_path: &str,
) -> Pod {
    let template = &deployment["spec"]["template"];
    let spec = template["spec"].clone();
    let containers = spec["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1);
    let container = containers[0].clone();
    let command = strings(&container["command"], "command");
    assert!(command[0].ends_with("/nodus"), "{command:?}");
    let args = strings(&container["args"], "args");
    assert_eq!(args[0], subcommand);
    let (public, admin) = ports(&args);

    let declared: Vec<i64> = container["ports"]
        .as_vec()
        .expect("container ports")
        .iter()
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    assert!(
        declared.contains(&public) && declared.contains(&admin),
        "{declared:?}"
    );

    for (probe, path) in [
        ("readinessProbe", probe_paths.0),
        ("livenessProbe", probe_paths.1),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(
            resolve_port(&get["port"], &container),
            admin,
            "{probe} port"
        );
    }

    let annotations = &template["metadata"]["annotations"];
    assert_eq!(
        string(&annotations["prometheus.io/scrape"], "scrape"),
        "true"
    );
    assert_eq!(
        string(&annotations["prometheus.io/port"], "scrape port"),
        admin.to_string()
    );
    assert_eq!(
        string(&annotations["prometheus.io/path"], "scrape path"),
        metrics_path
    );

    let requests = &container["resources"]["requests"];
    assert!(!requests["cpu"].is_badvalue() && !requests["memory"].is_badvalue());

    // The Service selects these pods and publishes the public port only.
    let labels = template["metadata"]["labels"]
        .as_hash()
        .expect("pod labels");
    let selector = service["spec"]["selector"].as_hash().expect("selector");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(labels.get(k), Some(v), "the Service selects {k:?} = {v:?}");
    }
    let targets: Vec<i64> = service["spec"]["ports"]
        .as_vec()
        .expect("Service ports")
        .iter()
        .map(|p| resolve_port(&p["targetPort"], &container))
        .collect();
    assert!(
        targets.contains(&public),
        "the Service targets {targets:?}, not {public}"
    );
    if admin != public {
        assert!(!targets.contains(&admin), "the admin port is published");
    }
    Pod {
        container,
        spec,
        args,
    }
}

fn grace_seconds(spec: &Yaml) -> f64 {
    spec["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("terminationGracePeriodSeconds") as f64
}

#[test]
fn kubernetes_serve_probes_scrapes_and_grace_match_its_args() {
    let pod = check_deployment(
        &manifest("nodus-serve.yaml"),
        "serve",
        |args| {
            let admin = flag(args, "--admin").expect("--admin (probes come from off the pod)");
            (
                port_of(flag(args, "--listen").expect("--listen")),
                port_of(admin),
            )
        },
        ("/_nodus/readyz", "/_nodus/healthz"),
        "/_nodus/metrics",
    );
    let delay = seconds(&pod.args, "--shutdown-delay", 0.0);
    assert!(
        delay > 0.0,
        "without --shutdown-delay, endpoint removal races the drain"
    );
    assert!(
        pod.container["lifecycle"]["preStop"].is_badvalue(),
        "the shutdown delay replaces a preStop hook"
    );
    let grace = grace_seconds(&pod.spec);
    let stop = serve_stop_bound(&pod.args);
    assert!(
        grace > stop,
        "terminationGracePeriodSeconds {grace} does not cover the stop: shutdown delay + drain + \
         {SERVE_STOP_MARGIN} s for the workers' kill and the exit's flush ({stop} s)"
    );
}

#[test]
fn kubernetes_run_probes_scrapes_and_grace_match_its_args() {
    let pod = check_deployment(
        &manifest("nodus-run.yaml"),
        "run",
        |args| {
            let l = port_of(flag(args, "-l").expect("-l ADDR"));
            (l, l)
        },
        ("/readyz", "/healthz"),
        "/metrics",
    );
    let program = pod.args.iter().position(|a| a == "--").expect("`-- CMD`");
    assert!(program + 1 < pod.args.len());
    for budget in ["--max-restarts", "--restart-window"] {
        assert!(flag(&pod.args, budget).is_some(), "args lack {budget}");
    }
    let sleep = pod.container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_i64()
        .expect("a preStop sleep (nodus run has no --shutdown-delay)") as f64;
    let grace = grace_seconds(&pod.spec);
    let stop = run_stop_bound(&pod.args);
    assert!(
        grace > sleep + stop,
        "terminationGracePeriodSeconds {grace} does not cover the {sleep} s preStop sleep and the \
         stop: twice the kill timeout + {RUN_EXIT_MARGIN} s for the exit's flush ({stop} s)"
    );
}

// ---- with systemd's tools ----

/// Copies `deploy/systemd` into `dir`, with `ExecStart` pointing at the built binary; returns
/// the unit files.
fn units_in(dir: &Path) -> Vec<PathBuf> {
    let mut units = Vec::new();
    for entry in std::fs::read_dir(deploy_dir().join("systemd")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let to = dir.join(path.file_name().unwrap());
        std::fs::write(&to, text.replace("/usr/local/bin/nodus", NODUS)).unwrap();
        units.push(to);
    }
    units.sort();
    units
}

/// `systemd-analyze verify`: its stderr lines about these units (unknown keys and values that do
/// not parse are only warnings: the exit status stays 0).
fn verify(units: &[PathBuf]) -> (bool, Vec<String>) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(units)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours = stderr
        .lines()
        .filter(|l| l.contains("nodus-"))
        .map(str::to_owned)
        .collect();
    (out.status.success(), ours)
}

#[test]
fn systemd_analyze_verifies_the_units_and_their_hardening() {
    if !have("systemd-analyze") {
        return;
    }
    let dir = TempDir::new("verify");
    let units = units_in(dir.path());
    assert!(units.len() >= 5, "{units:?}");
    let (ok, complaints) = verify(&units);
    assert!(
        ok && complaints.is_empty(),
        "systemd-analyze verify: {complaints:#?}"
    );

    // The check can fail: a misspelt value and a missing executable are reported.
    let service = dir.path().join("nodus-serve.service");
    let text = std::fs::read_to_string(&service).unwrap();
    std::fs::write(
        &service,
        text.replace("Type=notify", "Type=notifi")
            .replace(NODUS, "/nonexistent/nodus"),
    )
    .unwrap();
    let (ok, complaints) = verify(&units);
    assert!(!ok, "a missing executable is an error");
    assert!(
        complaints.iter().any(|l| l.contains("notifi")),
        "{complaints:#?}"
    );
    std::fs::write(&service, text).unwrap();

    // Exposure score 0 (locked down) to 10 (unprotected); `--threshold` is in tenths. Both units
    // score 3.2 with systemd 252; giving either a capability back would score 3.5.
    for name in ["nodus-serve.service", "nodus-run.service"] {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--threshold=34", "--no-pager"])
            .arg(dir.path().join(name))
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: exposure above 3.4\n{}",
            report.lines().last().unwrap_or_default()
        );
    }
}

/// A `systemd-socket-activate` that has become `nodus serve`; stopped by PID on drop.
struct Activated {
    proc: Proc,
    public: SocketAddr,
    admin: SocketAddr,
}

impl Activated {
    /// Listens on two free loopback ports (`http`, `admin`) and runs `nodus serve ARGS` on the
    /// first connection, as systemd would. Retries when a port was taken in between.
    fn start(args: &[&str], notify: &Path) -> Activated {
        for _ in 0..3 {
            let [public, admin] = free_addrs();
            let proc = Proc::spawn(
                Command::new("systemd-socket-activate")
                    .args(["-l", &public.to_string(), "-l", &admin.to_string()])
                    .arg("--fdname=http:admin")
                    .args(["-E", "RUST_LOG=info", "-E"])
                    .arg(format!("NOTIFY_SOCKET={}", notify.display()))
                    .arg(NODUS)
                    .args(args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped()),
            );
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut listening = 0;
            while listening < 2 {
                match proc
                    .lines
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    Ok(line) if line.starts_with("Listening on") => listening += 1,
                    Ok(_) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => panic!("systemd-socket-activate is silent"),
                }
            }
            if listening == 2 {
                return Activated {
                    proc,
                    public,
                    admin,
                };
            }
        }
        panic!("systemd-socket-activate could not listen on free ports three times");
    }
}

/// The next notify datagram that has `line` among its lines.
fn notified(manager: &UnixDatagram, line: &str) -> String {
    let mut buf = [0u8; 512];
    loop {
        let n = common::recv_datagram(manager, &mut buf)
            .unwrap_or_else(|e| panic!("no {line} on NOTIFY_SOCKET: {e}"));
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        if message.lines().any(|l| l == line) {
            return message;
        }
    }
}

#[test]
fn serve_under_systemd_socket_activation_serves_notifies_and_drains() {
    if !have("systemd-socket-activate") {
        return;
    }
    let dir = TempDir::new("activate");
    let site = dir.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello, systemd\n").unwrap();
    let notify_path = dir.path().join("notify.sock");
    let manager = UnixDatagram::bind(&notify_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    let site = site.to_str().unwrap();
    let mut server = Activated::start(
        &[
            "serve",
            site,
            "--shutdown-delay",
            "3",
            "--drain-timeout",
            "5",
        ],
        &notify_path,
    );
    // The first connection starts nodus, which serves it from the inherited socket.
    let hello = get(server.public, "/hello.txt");
    assert_eq!(
        (hello.status, hello.body),
        (200, b"hello, systemd\n".to_vec())
    );
    let exe = std::fs::read_link(format!("/proc/{}/exe", server.proc.id())).unwrap();
    assert_eq!(
        exe,
        std::fs::canonicalize(NODUS).unwrap(),
        "the activator execs nodus in place (LISTEN_PID is its pid)"
    );
    notified(&manager, "READY=1");
    // The socket named admin is the admin listener; the public one serves files only.
    assert_eq!(get(server.admin, "/_nodus/readyz").status, 200);
    assert_eq!(get(server.admin, "/_nodus/healthz").status, 200);
    assert_eq!(get(server.public, "/_nodus/readyz").status, 404);

    server.proc.signal(rustix::process::Signal::TERM);
    notified(&manager, "STOPPING=1");
    // Within --shutdown-delay: still serving, but no longer ready.
    assert_eq!(get(server.admin, "/_nodus/readyz").status, 503);
    assert_eq!(get(server.public, "/hello.txt").status, 200);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(30)), Some(0));
}
