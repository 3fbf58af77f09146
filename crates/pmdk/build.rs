//! Build script: find libpmemobj through pkg-config (Debian: `libpmemobj-dev`) and build the C
//! transaction shim against it as a *shared object* (`$OUT_DIR/libtiermem_pmdk_shim.so`, which
//! needs `libpmemobj.so.1`). Nothing is linked into the Rust crate: `sys` embeds the object and
//! loads it with `dlopen` at the first pool, so a program that uses this crate only for a
//! baseline does not load libpmemobj and its dependency chain (libpmem, libndctl, libkmod,
//! libcrypto, ...) at every start — about 2 ms and 190 page faults per exec on the development
//! VM, paid by every `tiermem` command, `tiermem prefault run` among them.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=build.rs");
    // The pkg-config crate emits rerun-if-env-changed for PKG_CONFIG_* itself.
    let lib = match pkg_config::Config::new()
        .atleast_version("1.8")
        .cargo_metadata(false)
        .probe("libpmemobj")
    {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!(
                "\n\
                 error: tiermem-pmdk needs PMDK's libpmemobj (>= 1.8) and its headers, found \
                 through pkg-config.\n\
                 \x20      On Debian/Ubuntu: apt-get install -y libpmemobj-dev pkg-config\n\
                 \x20      (scripts/setup.sh installs it on a fresh machine).\n\
                 \x20      pkg-config said: {e}\n"
            );
            std::process::exit(1);
        }
    };
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libtiermem_pmdk_shim.so");
    let compiler = cc::Build::new()
        .opt_level(2)
        .pic(true)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-shared", "-Wl,-z,now", "-Wl,--no-undefined", "-o"])
        .arg(&out)
        .arg("src/shim.c");
    for dir in &lib.include_paths {
        cmd.arg("-I").arg(dir);
    }
    for dir in &lib.link_paths {
        cmd.arg("-L").arg(dir);
    }
    for name in &lib.libs {
        cmd.arg(format!("-l{name}"));
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler for src/shim.c: {e}"));
    assert!(
        status.success(),
        "building {} from src/shim.c failed ({status})",
        out.display()
    );
    println!("cargo:rustc-env=TIERMEM_PMDK_SHIM_SO={}", out.display());
    println!("cargo:version={}", lib.version);
    println!("cargo:rustc-env=TIERMEM_LIBPMEMOBJ_VERSION={}", lib.version);
}
