//! Links the zygote against libpython (CPython 3.12) with an rpath, and records the build
//! interpreter's prefix as the default Python home.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    if std::env::var_os("CARGO_FEATURE_ZYGOTE").is_none() {
        return;
    }
    pyo3_build_config::add_libpython_rpath_link_args();
    let config = pyo3_build_config::get();
    // One interpreter version: `immortal.rs` writes 3.12's immortal reference count, whose
    // encoding changes between versions.
    let version = config.version();
    if (version.major, version.minor) != (3, 12) {
        panic!(
            "snakecage-worker builds against CPython 3.12, not {version}: set PYO3_PYTHON (source scripts/env.sh)"
        );
    }
    if let Some(lib_dir) = config.lib_dir() {
        let prefix = std::path::Path::new(lib_dir)
            .parent()
            .unwrap_or(std::path::Path::new("/"));
        println!(
            "cargo:rustc-env=SNAKECAGE_BUILD_PYTHON_HOME={}",
            prefix.display()
        );
    }
}
