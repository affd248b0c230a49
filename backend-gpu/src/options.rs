//! Backend options: each is read from the config's `[backend.<name>]` table, else from its
//! environment variable, else it takes its default.

use tandem_backend_api::BackendOptions;

/// Whether an option's value means yes: `1`, `true`, `yes` or `on`, in any case.
pub fn truthy(v: &str) -> bool {
    matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}

/// The value of option `key`, else of the environment variable `var` (`None` where neither is
/// set, or the variable is not Unicode).
pub fn setting(options: &BackendOptions, key: &str, var: &str) -> Option<String> {
    options
        .get(key)
        .map(str::to_string)
        .or_else(|| std::env::var(var).ok())
}

/// A yes/no option: [`setting`] read by [`truthy`], `default` where neither is set.
pub fn flag(options: &BackendOptions, key: &str, var: &str, default: bool) -> bool {
    setting(options, key, var).map_or(default, |v| truthy(&v))
}

/// A yes/no option without a default: `None` where neither the option nor the variable is set
/// (the backend then decides by what the device offers).
pub fn tristate(options: &BackendOptions, key: &str, var: &str) -> Option<bool> {
    setting(options, key, var).map(|v| truthy(&v))
}

/// Option `precision` (else the environment variable `var`): `Ok(true)` for `"fast"` (the
/// integer-dot decode kernels take 8-bit input), `Ok(false)` for `"exact"` or neither set, an
/// error naming the option otherwise.
pub fn fast_precision(options: &BackendOptions, var: &str) -> Result<bool, tandem_backend_api::BackendError> {
    match setting(options, "precision", var).as_deref() {
        None | Some("exact") => Ok(false),
        Some("fast") => Ok(true),
        Some(v) => Err(tandem_backend_api::BackendError::invalid(format!(
            "backend option 'precision' must be 'exact' or 'fast', not '{v}'"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthy_takes_the_four_yeses_in_any_case() {
        for v in ["1", "true", "TRUE", "Yes", "on", "ON"] {
            assert!(truthy(v), "{v}");
        }
        for v in ["0", "false", "no", "off", "", "2", "y", " true"] {
            assert!(!truthy(v), "{v}");
        }
    }

    #[test]
    fn options_win_over_the_environment_and_defaults_apply_last() {
        // Read-only use of the environment: PATH is set wherever tests run, the other never.
        let (set, unset) = ("PATH", "TANDEM_GPU_KIT_TEST_NEVER_SET");
        let path = std::env::var(set).ok();
        assert!(path.is_some(), "tests run with a PATH");
        let mut o = BackendOptions::default();
        assert_eq!(setting(&o, "k", set), path);
        assert_eq!(tristate(&o, "k", set), Some(false));
        assert_eq!(setting(&o, "k", unset), None);
        assert!(flag(&o, "k", unset, true));
        assert!(!flag(&o, "k", unset, false));
        assert_eq!(tristate(&o, "k", unset), None);
        o.set("k", "on");
        assert_eq!(setting(&o, "k", set).as_deref(), Some("on"));
        assert!(flag(&o, "k", set, false));
        assert_eq!(tristate(&o, "k", unset), Some(true));
        o.set("k", "0");
        assert!(!flag(&o, "k", unset, true));
    }
}
