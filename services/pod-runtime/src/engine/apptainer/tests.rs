//! The exact invocations of the Apptainer engine, and the launcher run for real with `sh`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::procs::ProcessInfo;
use super::*;

fn engine() -> Apptainer {
    Apptainer::new(Path::new("/state/apptainer"), vec!["127.0.0.1:5000".into()])
        .with_programs("/opt/apptainer/bin/apptainer", "/usr/bin/nsenter")
        .with_inherited_env(vec![("PATH".into(), "/usr/bin:/bin".into()), ("HOME".into(), "/home/u".into())])
}

fn args(cmd: &Command) -> Vec<String> {
    cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
}

/// The environment a command will have (it starts from an empty one).
fn env(cmd: &Command) -> BTreeMap<String, String> {
    cmd.get_envs()
        .filter_map(|(k, v)| Some((k.to_string_lossy().into_owned(), v?.to_string_lossy().into_owned())))
        .collect()
}

fn base_env() -> BTreeMap<String, String> {
    [
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/home/u"),
        ("APPTAINER_CACHEDIR", "/state/apptainer/cache"),
        ("APPTAINER_TMPDIR", "/state/apptainer/tmp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

const PINNED: &str =
    "127.0.0.1:5000/hpk/shell@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn pull_names_the_digest_and_keeps_credentials_off_the_command_line() {
    let out = Path::new("/state/apptainer/images/.pull-x/image.sif");
    let creds = Credentials::Basic { username: "alice".into(), password: "s3cret pass=word".into() };
    let cmd = engine().pull(PINNED, "127.0.0.1:5000", Some(&creds), out).expect("pull");
    assert_eq!(cmd.get_program(), "/opt/apptainer/bin/apptainer");
    assert_eq!(
        args(&cmd),
        ["pull", "--no-https", out.to_str().expect("utf-8"), &format!("docker://{PINNED}")]
    );
    let mut expected = base_env();
    expected.insert("APPTAINER_DOCKER_USERNAME".into(), "alice".into());
    expected.insert("APPTAINER_DOCKER_PASSWORD".into(), "s3cret pass=word".into());
    assert_eq!(env(&cmd), expected);
    assert!(!args(&cmd).iter().any(|a| a.contains("s3cret")));

    // A registry not listed as insecure is spoken to over HTTPS; no credentials, no variables.
    let secure = "ghcr.io/x/y@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let cmd = engine().pull(secure, "ghcr.io", None, out).expect("pull");
    assert_eq!(args(&cmd), ["pull", out.to_str().expect("utf-8"), &format!("docker://{secure}")]);
    assert_eq!(env(&cmd), base_env());
}

#[test]
fn tokens_are_refused_for_apptainer_pulls() {
    for token in [Credentials::RegistryToken("t".into()), Credentials::IdentityToken("t".into())] {
        let err = engine().pull(PINNED, "127.0.0.1:5000", Some(&token), Path::new("/x")).expect_err("token");
        assert!(matches!(err, Error::Unsupported(ref m) if m.contains("user name and password")), "{err}");
    }
}

#[test]
fn sif_files_are_named_by_the_sha256_of_the_full_reference() {
    let path = engine().sif_path(PINNED);
    let expected = hex::encode(Sha256::digest(format!("docker://{PINNED}").as_bytes()));
    assert_eq!(path, PathBuf::from(format!("/state/apptainer/images/{expected}.sif")));
    assert_ne!(engine().sif_path("a/b@sha256:1"), engine().sif_path("a/b@sha256:2"));
    // Whatever a reference holds, the file stays in the images directory.
    assert_eq!(engine().sif_path("../../etc/passwd").parent(), Some(Path::new("/state/apptainer/images")));
}

fn sandbox_spec() -> SandboxSpec {
    SandboxSpec {
        id: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        hostname: "my pod".into(),
        pause_binary: "/opt/hpk/hpk-pause".into(),
        events_dir: "/state/ev/0123456789abcdef".into(),
        grace_seconds: 7,
        host_network: false,
        host_ipc: false,
        sysctls: Default::default(),
    }
}

#[test]
fn host_namespaces_and_sysctls_are_refused() {
    let mut spec = sandbox_spec();
    spec.host_network = true;
    let err = engine().instance_start(&spec, Path::new("/state/sb/root")).expect_err("refused");
    assert!(err.to_string().contains("apptainer engine"), "{err}");
}

#[test]
fn a_sandbox_is_an_instance_running_hpk_pause_as_pid_1() {
    let cmd = engine().instance_start(&sandbox_spec(), Path::new("/state/sandboxes/s/root")).expect("start");
    assert_eq!(cmd.get_program(), "/opt/apptainer/bin/apptainer");
    let mut expected: Vec<String> = [
        "instance",
        "start",
        "--fakeroot",
        "--contain",
        "--net",
        "--network",
        "none",
        "--pid",
        "--ipc",
        "--uts",
        "--hostname",
        "my pod",
        "--no-init",
        "--bind",
        "/opt/hpk/hpk-pause:/hpk-pause:ro",
        "--bind",
        "/state/ev/0123456789abcdef:/run/hpk",
        "--bind",
        "/usr:/usr:ro",
    ]
    .map(String::from)
    .into();
    for dir in host_lib_dirs() {
        expected.extend(["--bind".to_owned(), format!("/{dir}:/{dir}:ro")]);
    }
    expected.extend(
        [
            "/state/sandboxes/s/root",
            "hpk-0123456789abcdef0123456789abcdef",
            "--events",
            "/run/hpk/events.sock",
            "--grace",
            "7",
        ]
        .map(String::from),
    );
    assert_eq!(args(&cmd), expected);
    assert_eq!(env(&cmd), base_env());
}

#[test]
fn a_pause_binary_apptainer_cannot_bind_is_refused() {
    let mut spec = sandbox_spec();
    spec.pause_binary = "/opt/hpk,1/hpk-pause".into();
    let err = engine().instance_start(&spec, Path::new("/r")).expect_err("comma");
    assert!(err.to_string().contains("cannot express"), "{err}");
}

#[test]
fn instances_are_stopped_listed_and_named_safely() {
    let id = &sandbox_spec().id;
    let name = "hpk-0123456789abcdef0123456789abcdef";
    let term = engine().instance_stop(id, Stop::Term { timeout: 12 }).expect("stop");
    assert_eq!(args(&term), ["instance", "stop", "--signal", "SIGTERM", "--timeout", "12", name]);
    let kill = engine().instance_stop(id, Stop::Kill).expect("stop");
    assert_eq!(args(&kill), ["instance", "stop", "--force", name]);
    let list = engine().instance_list(id).expect("list");
    assert_eq!(args(&list), ["instance", "list", "--json", name]);
    for bad in ["", "../x", "a b", "a;b"] {
        assert!(Apptainer::instance_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_instance_pid_comes_from_the_json_listing() {
    let json = br#"{
        "instances": [
            {"instance": "other", "pid": 10, "img": "/x", "ip": "", "logErrPath": "", "logOutPath": ""},
            {"instance": "hpk-abc", "pid": 4242, "img": "/state/root", "ip": "", "logErrPath": "", "logOutPath": ""}
        ]
    }"#;
    assert_eq!(parse_instance_pid(json, "hpk-abc").expect("json"), Some(4242));
    assert_eq!(parse_instance_pid(json, "hpk-none").expect("json"), None);
    assert_eq!(parse_instance_pid(br#"{"instances": []}"#, "hpk-abc").expect("json"), None);
    assert!(parse_instance_pid(b"FATAL: no instance", "hpk-abc").is_err());
}

fn launch() -> ContainerLaunch {
    ContainerLaunch {
        image: "/state/apptainer/images/abc.sif".into(),
        args: vec![
            "sh".into(),
            "-c".into(),
            "echo \"it's $HOME\" 'and; more' `x`".into(),
            "two words".into(),
            "--help".into(),
        ],
        env: vec![
            "A=1".into(),
            "URL=http://x/?a=b&c=d".into(),
            "MULTI=line one\nline two".into(),
            "EMPTY=".into(),
        ],
        cwd: "/work dir".into(),
        fakeroot: true,
        mounts: vec![("/data/in".into(), "/in".into(), true), ("/data/out".into(), "/out put".into(), false)],
        readonly_rootfs: false,
        start_fifo: "/state/containers/c/apptainer.start".into(),
        pid_file: "/state/containers/c/apptainer.pid".into(),
    }
}

#[test]
fn a_container_is_launched_in_the_sandbox_namespaces_with_every_argument_verbatim() {
    let cmd = engine().launch(4242, &launch()).expect("launch");
    assert_eq!(cmd.get_program(), "/usr/bin/nsenter");
    let expected: Vec<String> = [
        "--target",
        "4242",
        "--net",
        "--ipc",
        "--uts",
        "--pid",
        "--",
        "/bin/sh",
        "-c",
        LAUNCHER,
        "hpk-launch",
        "/state/containers/c/apptainer.start",
        "/state/containers/c/apptainer.pid",
        "/opt/apptainer/bin/apptainer",
        "exec",
        "--fakeroot",
        "--contain",
        "--cleanenv",
        "--writable-tmpfs",
        "--pwd",
        "/work dir",
        "--bind",
        "/data/in:/in:ro",
        "--bind",
        "/data/out:/out put",
        "/state/apptainer/images/abc.sif",
        "sh",
        "-c",
        "echo \"it's $HOME\" 'and; more' `x`",
        "two words",
        "--help",
    ]
    .map(String::from)
    .into();
    // Arguments are argv entries, never re-parsed by a shell: quotes, `$`, spaces and
    // backquotes arrive as written.
    assert_eq!(args(&cmd), expected);
    let mut expected_env = base_env();
    for (k, v) in [
        ("APPTAINERENV_A", "1"),
        ("APPTAINERENV_URL", "http://x/?a=b&c=d"),
        ("APPTAINERENV_MULTI", "line one\nline two"),
        ("APPTAINERENV_EMPTY", ""),
    ] {
        expected_env.insert(k.into(), v.into());
    }
    assert_eq!(env(&cmd), expected_env);
}

#[test]
fn a_read_only_container_of_another_user_gets_no_writable_layer_and_no_fakeroot() {
    let mut c = launch();
    c.readonly_rootfs = true;
    c.fakeroot = false;
    let cmd = engine().launch(1, &c).expect("launch");
    let got = args(&cmd);
    let exec = got.iter().position(|a| a == "exec").expect("exec");
    assert_eq!(got[exec + 1..exec + 5], ["--contain", "--cleanenv", "--pwd", "/work dir"]);
}

#[test]
fn what_apptainer_cannot_express_is_refused_clearly() {
    for (host, dest) in [("/data,x", "/in"), ("/data:x", "/in"), ("/data", "/in,ro"), ("/data", "/a:b")] {
        let mut c = launch();
        c.mounts = vec![(host.into(), dest.into(), false)];
        let err = engine().launch(1, &c).expect_err("bind");
        assert!(
            matches!(err, Error::Unsupported(ref m) if m.contains("--bind syntax cannot express")),
            "{host} {dest}: {err}"
        );
    }
    for name in ["my.var", "a-b", "1ABC", ""] {
        let mut c = launch();
        c.env = vec![format!("{name}=v")];
        let err = engine().launch(1, &c).expect_err("env name");
        assert!(matches!(err, Error::Unsupported(ref m) if m.contains("shell identifiers")), "{name}: {err}");
    }
    check_env_name("_Ok_1").expect("identifier");
}

#[test]
fn exec_enters_the_container_process_with_its_environment_only() {
    let env_in: Vec<(OsString, OsString)> =
        vec![("PATH".into(), "/bin".into()), ("X".into(), "a=b\nc".into())];
    let cmd = engine().exec(777, true, &env_in, &["ls".into(), "-l".into(), "a b".into()]);
    let std = cmd.as_std();
    assert_eq!(std.get_program(), "/usr/bin/nsenter");
    assert_eq!(
        args(std),
        [
            "--target", "777", "--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--root", "--wd",
            "-S", "0", "-G", "0", "--", "ls", "-l", "a b"
        ]
    );
    let expected: BTreeMap<String, String> =
        [("PATH", "/bin"), ("X", "a=b\nc")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
    assert_eq!(env(std), expected);
    let plain = engine().exec(777, false, &env_in, &["id".into()]);
    assert!(args(plain.as_std()).contains(&"--preserve-credentials".to_owned()));
    assert!(!args(plain.as_std()).contains(&"-S".to_owned()));
}

#[test]
fn loopback_is_brought_up_from_the_sandbox_user_namespace() {
    let cmd = engine().loopback_up(99);
    assert_eq!(args(&cmd), ["--target", "99", "--user", "--net", "--", "ip", "link", "set", "lo", "up"]);
}

#[test]
fn the_sandbox_root_has_a_startscript_that_execs_hpk_pause() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    engine().write_sandbox_root(tmp.path()).expect("root");
    let script = tmp.path().join(".singularity.d/startscript");
    assert_eq!(std::fs::read_to_string(&script).expect("read"), "#!/bin/sh\nexec /hpk-pause \"$@\"\n");
    assert_eq!(std::fs::metadata(&script).expect("stat").permissions().mode() & 0o777, 0o755);
    for path in ["hpk-pause", "run/hpk", "proc", "dev", "usr", "etc/passwd"] {
        assert!(tmp.path().join(path).exists(), "{path}");
    }
    assert_eq!(std::fs::read_link(tmp.path().join("bin")).expect("link"), Path::new("usr/bin"));
    // Written twice (a retried start), it is the same.
    engine().write_sandbox_root(tmp.path()).expect("again");
}

/// The launcher under a real `sh`, with a stand-in for apptainer: it waits for the start line,
/// then runs the command with its arguments verbatim, the same PID as it wrote, and the stdin
/// it was given.
#[test]
fn the_launcher_waits_for_start_then_execs_in_place() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (fifo, pid_file, out) = (tmp.path().join("start"), tmp.path().join("pid"), tmp.path().join("out"));
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    std::fs::write(tmp.path().join("in"), "from stdin\n").expect("stdin");
    let script = "echo \"pid=$$\"; for a in \"$@\"; do echo \"[$a]\"; done; cat";
    let status = Command::new("/bin/sh")
        .args(["-c", LAUNCHER, "hpk-launch"])
        .arg(&fifo)
        .arg(&pid_file)
        .args(["/bin/sh", "-c", script, "stand-in", "a b", "$HOME", "it's", "x=y\nz"])
        .stdin(std::fs::File::open(tmp.path().join("in")).expect("open"))
        .stdout(std::fs::File::create(&out).expect("out"))
        .stderr(std::process::Stdio::inherit())
        .status()
        .expect("run the launcher");
    assert!(status.success());
    let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid file").trim().parse().expect("a PID");
    // Not started yet: waiting, nothing printed.
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(std::fs::read_to_string(&out).expect("out"), "");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"start\n"))
        .expect("start");
    let expected = format!("pid={pid}\n[a b]\n[$HOME]\n[it's]\n[x=y\nz]\nfrom stdin\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = std::fs::read_to_string(&out).expect("out");
        if got == expected {
            break;
        }
        assert!(Instant::now() < deadline, "output so far: {got:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn proc(host_pid: u32, ppid: u32, ns_pid: i32, pid_ns: &str, mnt_ns: &str, argv0: &str) -> ProcessInfo {
    ProcessInfo { host_pid, ppid, ns_pid, pid_ns: pid_ns.into(), mnt_ns: mnt_ns.into(), argv0: argv0.into() }
}

/// A host with an instance (starter 100, pause 101 = PID 1 of `pid:[9]`) and a container:
/// apptainer's master 110 (PID 7 in the sandbox, host mounts), its container process 111 in
/// `mnt:[5]`, and a child 112 of that.
fn host() -> Vec<ProcessInfo> {
    vec![
        proc(1, 0, 1, "pid:[1]", "mnt:[1]", "/sbin/init"),
        proc(100, 1, 100, "pid:[1]", "mnt:[1]", "Apptainer instance: u [hpk-x]"),
        proc(101, 100, 1, "pid:[9]", "mnt:[4]", "/hpk-pause"),
        proc(110, 101, 7, "pid:[9]", "mnt:[1]", "/usr/bin/apptainer"),
        proc(111, 110, 8, "pid:[9]", "mnt:[5]", "sleep"),
        proc(112, 111, 9, "pid:[9]", "mnt:[5]", "sleep"),
        proc(200, 1, 7, "pid:[3]", "mnt:[1]", "elsewhere"),
    ]
}

#[test]
fn processes_are_found_by_namespace_and_tree() {
    let all = host();
    assert_eq!(find_pause_in(&all, 101), Some(101));
    assert_eq!(find_pause_in(&all, 100), Some(101));
    assert_eq!(find_pause_in(&all, 111), None);
    // PID 7 of the sandbox is the master, not PID 7 of another namespace.
    assert_eq!(host_pid_in(&all, 101, 7), Some(110));
    assert_eq!(host_pid_in(&all, 101, 42), None);
    assert_eq!(process_tree(&all, 110), [110, 111, 112]);
    assert_eq!(process_tree(&all, 999), Vec::<u32>::new());
    assert_eq!(container_process(&all, 110), Some(111));
    assert_eq!(container_process(&all, 111), None);
}

#[test]
fn the_scan_sees_this_process() {
    let me = std::process::id();
    let all = scan();
    let mine = all.iter().find(|p| p.host_pid == me).expect("listed");
    assert_eq!(mine.ppid, nix::unistd::getppid().as_raw().unsigned_abs());
    assert!(mine.mnt_ns.to_string_lossy().starts_with("mnt:["));
}
