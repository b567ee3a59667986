//! The two ready-made test images, from the host's static busybox (Debian's `busybox-static`).

use super::*;

/// Where Debian's `busybox-static` installs the binary the ready-made images carry.
pub const BUSYBOX: &str = "/bin/busybox";
/// The port the httpd image listens on.
pub const HTTPD_PORT: u16 = 8080;
/// The body of `/www/index.html` in the httpd image, for tests to compare against.
pub const HTTPD_INDEX: &str = "hpk test image: busybox httpd is serving\n";

/// Whether the host has the busybox the ready-made images need.
pub fn busybox_available() -> bool {
    Path::new(BUSYBOX).is_file()
}

/// The base layer of both ready-made images: the host's static busybox as `/bin/busybox`, a
/// symlink in `/bin` for every applet it lists, `/tmp`, and a root user in `/etc`.
pub fn busybox_layer() -> Result<Layer> {
    let path = Path::new(BUSYBOX);
    let host_err = |action| move |source| Error::HostFile { action, path: path.to_owned(), source };
    let binary = std::fs::read(path).map_err(host_err("reading"))?;
    let out = std::process::Command::new(path).arg("--list").output().map_err(host_err("running"))?;
    if !out.status.success() {
        return Err(Error::BusyboxList {
            path: path.to_owned(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut layer = LayerBuilder::new();
    layer.file("bin/busybox", binary, 0o755)?;
    let list = String::from_utf8_lossy(&out.stdout);
    // A name with a slash would not be an applet; skip it rather than fail on an odd build.
    for applet in list.lines().map(str::trim) {
        if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
            layer.symlink(&format!("bin/{applet}"), "busybox")?;
        }
    }
    layer
        .dir("tmp", 0o1777)?
        .file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)?
        .file("etc/group", "root:x:0:\n", 0o644)?
        .dir("root", 0o700)?;
    layer.build()
}

/// A busybox shell image; its default command is `sh`.
pub fn shell_image() -> Result<Image> {
    let config = ImageConfig {
        cmd: vec!["sh".to_owned()],
        env: vec![DEFAULT_PATH.to_owned()],
        ..ImageConfig::default()
    };
    build_image(vec![busybox_layer()?], &config)
}

/// A busybox httpd serving [`HTTPD_INDEX`] at `/` on port [`HTTPD_PORT`]; the busybox base
/// layer is the shell image's, so a push after the shell image uploads only the `/www` layer.
pub fn httpd_image() -> Result<Image> {
    let mut www = LayerBuilder::new();
    www.dir("www", 0o755)?.file("www/index.html", HTTPD_INDEX, 0o644)?;
    let port = HTTPD_PORT.to_string();
    let config = ImageConfig {
        cmd: ["/bin/busybox", "httpd", "-f", "-p", port.as_str(), "-h", "/www"].map(str::to_owned).to_vec(),
        env: vec![DEFAULT_PATH.to_owned()],
        working_dir: Some("/www".to_owned()),
        ..ImageConfig::default()
    };
    build_image(vec![busybox_layer()?, www.build()?], &config)
}

/// The UIDs and GIDs [`owners_image`]'s files belong to: a user's home (1000), a group's
/// shared directory (50000, as agnhost's image has), a web server's cache (101, as nginx's).
pub const OWNERS: [(&str, u32, u32); 3] =
    [("home/user", 1000, 1000), ("srv/shared", 0, 50000), ("var/cache/web", 101, 101)];

/// A busybox image whose files belong to several users, as most real images' do: a home of
/// UID 1000 (0700), a setgid directory of GID 50000 (2770) and a cache of UID 101 (0700), each
/// with a file of its owner's, and those users in `/etc/passwd` and `/etc/group`.
pub fn owners_image() -> Result<Image> {
    let mut layer = LayerBuilder::new();
    layer
        .file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nweb:x:101:101::/var/cache/web:/bin/sh\n", 0o644)?
        .file("etc/group", "root:x:0:\nuser:x:1000:\nweb:x:101:\nshared:x:50000:user,web\n", 0o644)?
        .dir("home/user", 0o700)?
        .file("home/user/.profile", "echo welcome\n", 0o644)?
        .dir("srv/shared", 0o2770)?
        .file("srv/shared/readme", "shared\n", 0o660)?
        .dir("var/cache/web", 0o700)?
        .file("var/cache/web/index", "cached\n", 0o600)?;
    layer.chown("home/user", 1000, 1000)?.chown("home/user/.profile", 1000, 1000)?;
    layer.chown("srv/shared", 0, 50000)?.chown("srv/shared/readme", 0, 50000)?;
    layer.chown("var/cache/web", 101, 101)?.chown("var/cache/web/index", 101, 101)?;
    let config = ImageConfig {
        cmd: vec!["sh".to_owned()],
        env: vec![DEFAULT_PATH.to_owned()],
        ..ImageConfig::default()
    };
    build_image(vec![busybox_layer()?, layer.build()?], &config)
}
