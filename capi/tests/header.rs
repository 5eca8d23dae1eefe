//! The checked-in header is what cbindgen makes of the current source, as the generated
//! FlatBuffers code is what flatc makes of the schema.

use std::path::Path;

#[test]
fn the_header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("config");
    // The kinds' constants come from the schema's list, not from literals in the source.
    config.after_includes = Some(poolsight_capi::constants::c_defines());
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut fresh);
    let path = crate_dir.join("include/poolsight.h");
    if std::env::var_os("POOLSIGHT_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write header");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "capi/include/poolsight.h is stale: run `POOLSIGHT_BLESS=1 cargo test -p poolsight-capi --test header` and commit it"
    );
}
