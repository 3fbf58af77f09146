//! Build script: find libpmemobj through pkg-config (Debian: `libpmemobj-dev`), compile the C
//! transaction shim against its headers, and link both.

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
    let mut build = cc::Build::new();
    build.file("src/shim.c").warnings(true).extra_warnings(true);
    for dir in &lib.include_paths {
        build.include(dir);
    }
    // Emits the link line for the static shim first; libpmemobj must follow it.
    build.compile("tiermem_pmdk_shim");
    for dir in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for name in &lib.libs {
        println!("cargo:rustc-link-lib={name}");
    }
    println!("cargo:version={}", lib.version);
    println!("cargo:rustc-env=TIERMEM_LIBPMEMOBJ_VERSION={}", lib.version);
}
