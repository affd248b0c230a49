//! Marks the plugin library not to be unloaded (`-z nodelete`): once wgpu has driven a device,
//! unloading the library and loading it again crashed the next device in the same process on
//! the NVIDIA driver (the conformance tests create and drop backends many times; measured on
//! the H100 machine: a segfault without the flag, 4/4 tests passing with the library kept).
fn main() {
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if matches!(target_os.as_str(), "linux" | "android" | "freebsd") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
