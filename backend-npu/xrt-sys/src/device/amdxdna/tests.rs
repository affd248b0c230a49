use super::*;
use crate::detect::{Generation, PciId};
use std::path::{Path, PathBuf};

fn info(node: &Path) -> DeviceInfo {
    DeviceInfo {
        node: node.to_path_buf(),
        pci: PciId {
            slot: "0000:c5:00.1".into(),
            vendor: 0x1022,
            device: 0x17f0,
            revision: 0x10,
        },
        generation: Generation::Npu4,
        driver: Some("amdxdna".into()),
        vbnv: "RyzenAI-npu4".into(),
        device_type: Some(0),
        firmware_version: None,
        driver_version: "test".into(),
        kernel_release: None,
        xrt_version: None,
    }
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xrt-sys-dev-{name}-{}", std::process::id()))
}

#[test]
fn missing_node_names_the_path() {
    let path = temp_path("missing");
    let err = Amdxdna::open(info(&path)).unwrap_err();
    assert!(
        matches!(&err, XrtError::Open { path: p, .. } if p == &path),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("No such file"),
        "{msg}"
    );
}

#[test]
fn regular_file_is_not_a_device() {
    let path = temp_path("regular");
    std::fs::write(&path, b"").expect("temp file");
    let err = Amdxdna::open(info(&path)).unwrap_err();
    let _ = std::fs::remove_file(&path);
    assert!(
        matches!(&err, XrtError::NotADevice { path: p } if p == &path),
        "{err:?}"
    );
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}

#[test]
fn a_char_device_that_is_not_an_npu_fails_at_the_first_ioctl() {
    // /dev/null opens read-write; the first amdxdna ioctl it gets is the heap's CREATE_BO.
    let err = Amdxdna::open(info(Path::new("/dev/null"))).unwrap_err();
    match &err {
        XrtError::Ioctl { call, errno, .. } => {
            assert_eq!(*call, "DRM_IOCTL_AMDXDNA_CREATE_BO");
            assert_eq!(*errno, libc::ENOTTY);
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("DRM_IOCTL_AMDXDNA_CREATE_BO") && msg.contains("device heap"),
        "{msg}"
    );
}

#[test]
fn open_first_reports_why_nothing_is_usable() {
    let root = temp_path("emptyroot");
    std::fs::create_dir_all(&root).expect("dir");
    let err = crate::open_first(&root).unwrap_err();
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        matches!(err, XrtError::Unavailable(crate::Unavailable::NoDevice { .. })),
        "{err:?}"
    );
}

#[test]
fn messages_name_the_call() {
    let e = XrtError::Timeout {
        call: "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
        after: Duration::from_secs(2),
    };
    assert_eq!(
        e.to_string(),
        "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT timed out after 2s: the command has not completed"
    );
    let e = XrtError::CommandFailed {
        state: CommandState::Error,
    };
    assert_eq!(e.to_string(), "the NPU command finished in state 5 (ERROR)");
    let e = ioctl_err(
        "DRM_IOCTL_AMDXDNA_EXEC_CMD",
        libc::EINVAL,
        "submitting to context 1",
    );
    assert!(
        e.to_string()
            .starts_with("DRM_IOCTL_AMDXDNA_EXEC_CMD failed: Invalid argument"),
        "{e}"
    );
    assert!(XrtError::Busy {
        path: "/dev/accel/accel0".into()
    }
    .to_string()
    .contains("EBUSY"));
}

#[test]
fn sizes_round_to_pages() {
    assert_eq!(round_up(1).ok(), Some(4096));
    assert_eq!(round_up(4096).ok(), Some(4096));
    assert_eq!(round_up(4097).ok(), Some(8192));
    assert!(round_up(0).is_err());
    assert!(round_up(usize::MAX).is_err());
}

#[test]
fn amdxdna_is_send() {
    fn send<T: Send>() {}
    send::<Amdxdna>();
    send::<Box<dyn NpuDevice>>();
}

#[test]
fn a_command_the_driver_reset_is_a_reset_and_others_fail_as_themselves() {
    assert!(finished(7, CommandState::Completed, 0, 0).is_ok());
    for state in [
        CommandState::Timeout,
        CommandState::NoResponse,
        CommandState::Abort,
        CommandState::New,
        CommandState::Submitted,
    ] {
        for count in [0, 3] {
            let e = finished(7, state, 1, count).unwrap_err();
            assert!(matches!(e, XrtError::DeviceReset { .. }), "{state}: {e}");
            assert!(e.is_device_lost(), "{state}");
            assert!(e.to_string().contains("run 7"), "{e}");
        }
    }
    let e = finished(7, CommandState::Error, 1, 3).unwrap_err();
    assert!(
        matches!(
            e,
            XrtError::ChainCommandFailed {
                index: 1,
                count: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(!e.is_device_lost());
    let e = finished(7, CommandState::SkCrashed, 0, 0).unwrap_err();
    assert!(
        matches!(e, XrtError::CommandFailed { .. }) && !e.is_device_lost(),
        "{e}"
    );
}
