use super::*;
use std::os::unix::fs::symlink;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fake filesystem root in the temp dir, removed on drop.
pub(crate) struct FakeRoot(pub PathBuf);

impl FakeRoot {
    pub(crate) fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xrt-sys-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }

    fn link(&self, rel: &str, target: &str) {
        let p = self.0.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        symlink(target, p).expect("symlink");
    }

    fn pci(&self, slot: &str, vendor: &str, device: &str, rev: &str) {
        let d = format!("sys/bus/pci/devices/{slot}");
        self.write(&format!("{d}/vendor"), &format!("{vendor}\n"));
        self.write(&format!("{d}/device"), &format!("{device}\n"));
        self.write(&format!("{d}/revision"), &format!("{rev}\n"));
    }

    fn kernel(&self, release: &str) {
        self.write("proc/sys/kernel/osrelease", &format!("{release}\n"));
    }

    fn driver_loaded(&self) {
        fs::create_dir_all(self.0.join("sys/module/amdxdna")).expect("module dir");
    }

    /// A bound NPU with its attributes, class link and node.
    fn bound_npu(&self, slot: &str, device: &str, rev: &str, vbnv: &str, fw: &str) {
        self.pci(slot, "0x1022", device, rev);
        let d = format!("sys/bus/pci/devices/{slot}");
        self.link(&format!("{d}/driver"), "../../../../bus/pci/drivers/amdxdna");
        self.write(&format!("{d}/vbnv"), &format!("{vbnv}\n"));
        self.write(&format!("{d}/device_type"), "0\n");
        self.write(&format!("{d}/fw_version"), &format!("{fw}\n"));
        self.link(
            "sys/class/accel/accel0/device",
            &format!("../../../bus/pci/devices/{slot}"),
        );
        self.write("dev/accel/accel0", "");
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn unavailable(root: &FakeRoot) -> Unavailable {
    match detect(&root.0) {
        Detection::Unavailable(u) => u,
        Detection::Found(f) => panic!("unexpectedly found {f:?}"),
    }
}

fn found(root: &FakeRoot) -> Vec<DeviceInfo> {
    match detect(&root.0) {
        Detection::Found(f) => f,
        Detection::Unavailable(u) => panic!("unavailable: {u}"),
    }
}

#[test]
fn empty_root_has_no_device() {
    let root = FakeRoot::new("empty");
    let u = unavailable(&root);
    assert!(matches!(u, Unavailable::NoDevice { .. }));
    let msg = u.to_string();
    assert!(msg.contains("1022:1502") && msg.contains("1022:17f0"), "{msg}");
}

#[test]
fn driver_but_no_device() {
    let root = FakeRoot::new("nodev");
    root.driver_loaded();
    root.kernel("6.14.0-15-generic");
    // An AMD PCI function that is not an NPU.
    root.pci("0000:00:00.0", "0x1022", "0x14e8", "0x00");
    root.pci("0000:c5:00.1", "0x8086", "0x1502", "0x00");
    assert!(matches!(unavailable(&root), Unavailable::NoDevice { .. }));
}

#[test]
fn device_but_no_driver_names_the_kernel_needed() {
    let root = FakeRoot::new("nodrv");
    root.kernel("6.8.0-49-generic");
    root.pci("0000:c5:00.1", "0x1022", "0x17f0", "0x10");
    let u = unavailable(&root);
    assert!(matches!(u, Unavailable::NoDriver { too_old: true, .. }), "{u:?}");
    let msg = u.to_string();
    assert!(msg.contains("6.14") && msg.contains("6.8.0-49-generic"), "{msg}");
    assert!(msg.contains("upgrade"), "{msg}");

    // A new enough kernel without the module loaded: say modprobe.
    let root = FakeRoot::new("nodrv2");
    root.kernel("6.15.2-arch1-1");
    root.pci("0000:c5:00.1", "0x1022", "0x17f0", "0x10");
    let msg = unavailable(&root).to_string();
    assert!(msg.contains("modprobe amdxdna"), "{msg}");
}

#[test]
fn npu1_phoenix() {
    let root = FakeRoot::new("npu1");
    root.kernel("6.14.0-15-generic");
    root.driver_loaded();
    root.bound_npu("0000:c4:00.1", "0x1502", "0x00", "RyzenAI-npu1", "1.5.4.389");
    let f = found(&root);
    assert_eq!(f.len(), 1);
    let d = &f[0];
    assert_eq!(d.generation, Generation::Npu1);
    assert_eq!(
        (d.generation.aie(), d.generation.columns(), d.generation.rows()),
        ("aie2", 5, 4)
    );
    assert_eq!(
        d.pci,
        PciId {
            slot: "0000:c4:00.1".into(),
            vendor: 0x1022,
            device: 0x1502,
            revision: 0
        }
    );
    assert_eq!(d.node, root.0.join("dev/accel/accel0"));
    assert_eq!(d.driver.as_deref(), Some("amdxdna"));
    assert_eq!(d.vbnv, "RyzenAI-npu1");
    assert_eq!(d.device_type, Some(0));
    assert_eq!(d.firmware_version.as_deref(), Some("1.5.4.389"));
    assert_eq!(d.driver_version, "in-tree (Linux 6.14.0-15-generic)");
    assert_eq!(d.kernel_release.as_deref(), Some("6.14.0-15-generic"));
    assert_eq!(d.xrt_version, None);
}

#[test]
fn npu4_strix_with_dkms_driver_and_xrt() {
    let root = FakeRoot::new("npu4");
    root.kernel("6.11.0-1016-oem");
    root.driver_loaded();
    root.write("sys/module/amdxdna/version", "2.19.0_20250305\n");
    root.write(
        "opt/xilinx/xrt/version.json",
        "{\n  \"BUILD_VERSION\" : \"2.19.0\",\n  \"BUILD_VERSION_DATE\" : \"Wed, 05 Mar 2025\",\n  \"BUILD_BRANCH\" : \"2025.1\"\n}\n",
    );
    root.bound_npu("0000:c5:00.1", "0x17f0", "0x10", "RyzenAI-npu4", "1.0.0.63");
    let d = &found(&root)[0];
    assert_eq!(d.generation, Generation::Npu4);
    assert_eq!(
        (d.generation.aie(), d.generation.columns(), d.generation.rows()),
        ("aie2p", 8, 4)
    );
    assert_eq!(d.pci.revision, 0x10);
    assert_eq!(d.driver_version, "2.19.0_20250305");
    assert_eq!(d.xrt_version.as_deref(), Some("2.19.0"));
    assert_eq!(d.firmware_version.as_deref(), Some("1.0.0.63"));
    assert!(d.summary().contains("npu4"), "{}", d.summary());
}

#[test]
fn accel_node_found_through_the_pci_dir() {
    let root = FakeRoot::new("pciaccel");
    root.kernel("6.14.0");
    root.driver_loaded();
    root.pci("0000:c5:00.1", "0x1022", "0x17f0", "0x11");
    root.write("sys/bus/pci/devices/0000:c5:00.1/accel/accel3/dev", "261:3\n");
    let d = &found(&root)[0];
    assert_eq!(d.generation, Generation::Npu5);
    assert_eq!(d.node, root.0.join("dev/accel/accel3"));
    assert_eq!(d.vbnv, "RyzenAI-npu5"); // no vbnv attribute: the driver's default
    assert_eq!(d.driver, None);
}

#[test]
fn driver_and_device_without_accel_node_points_at_firmware() {
    let root = FakeRoot::new("nofw");
    root.kernel("6.14.0");
    root.driver_loaded();
    root.pci("0000:c5:00.1", "0x1022", "0x17f0", "0x10");
    root.link(
        "sys/bus/pci/devices/0000:c5:00.1/driver",
        "../../../../bus/pci/drivers/amdxdna",
    );
    let u = unavailable(&root);
    assert!(
        matches!(
            &u,
            Unavailable::NoAccelNode {
                generation: Generation::Npu4,
                ..
            }
        ),
        "{u:?}"
    );
    let msg = u.to_string();
    assert!(msg.contains("/lib/firmware/amdnpu/17f0_10/"), "{msg}");
    assert!(msg.contains("firmware"), "{msg}");
    assert!(!msg.contains("bound to"), "{msg}");

    // Not bound at all (probe failed).
    let root = FakeRoot::new("nofw2");
    root.kernel("6.14.0");
    root.driver_loaded();
    root.pci("0000:c4:00.1", "0x1022", "0x1502", "0x00");
    let msg = unavailable(&root).to_string();
    assert!(
        msg.contains("/lib/firmware/amdnpu/1502_00/") && msg.contains("no driver bound"),
        "{msg}"
    );
}

#[test]
fn unknown_revision() {
    let root = FakeRoot::new("rev");
    root.kernel("6.14.0");
    root.driver_loaded();
    root.pci("0000:c5:00.1", "0x1022", "0x17f0", "0x12");
    let u = unavailable(&root);
    assert_eq!(
        u,
        Unavailable::UnknownRevision {
            pci: PciId {
                slot: "0000:c5:00.1".into(),
                vendor: 0x1022,
                device: 0x17f0,
                revision: 0x12
            }
        }
    );
    let msg = u.to_string();
    assert!(msg.contains("rev 0x12") && msg.contains("driver table"), "{msg}");
}

#[test]
fn helpers() {
    assert_eq!(kernel_version("6.14.0-15-generic"), Some((6, 14)));
    assert_eq!(kernel_version("6.8"), Some((6, 8)));
    assert_eq!(kernel_version("garbage"), None);
    assert_eq!(
        json_string_field(r#"{"BUILD_VERSION":"2.20.1"}"#, "BUILD_VERSION").as_deref(),
        Some("2.20.1")
    );
    assert_eq!(json_string_field("{}", "BUILD_VERSION"), None);
}
