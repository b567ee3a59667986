//! Images of one static binary (metrics-server, CoreDNS), as upstream ships them on a
//! distroless base: the binary at `/<name>` as the entrypoint, `/tmp`, nothing else.

use super::*;

/// An image whose only program is `binary` (the bytes of a statically linked executable),
/// installed as `/<name>` and run as the entrypoint; `tmp/` is the only other entry.
pub fn static_binary_image(name: &str, binary: Vec<u8>) -> Result<Image> {
    let path = format!("/{name}");
    let mut layer = LayerBuilder::new();
    layer.dir("tmp", 0o1777)?.file(&path, binary, 0o755)?;
    let config = ImageConfig { entrypoint: vec![path], ..ImageConfig::default() };
    build_image(vec![layer.build()?], &config)
}

/// [`static_binary_image`] of the file at `path`, named after its file name.
pub fn static_binary_image_from(path: &Path) -> Result<Image> {
    let read_err = |source| Error::Binary { path: path.to_owned(), source };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::InvalidPath { path: path.display().to_string(), reason: "no file name" })?;
    static_binary_image(name, std::fs::read(path).map_err(read_err)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_is_the_entrypoint() {
        let image = static_binary_image("tool", b"\x7fELF".to_vec()).expect("image");
        assert_eq!(layer_paths(&image.layers[0].blob.data).expect("paths"), ["tmp/", "tool"]);
        let config: serde_json::Value = serde_json::from_slice(&image.config.data).expect("config");
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/tool"]));
    }
}
