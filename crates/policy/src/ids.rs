//! The bundle id the operator gives Manager for a Bundle object.
//!
//! `<namespace>.<name>`: namespaces are DNS labels (no dots), so the first dot splits it back
//! unambiguously, and Manager refuses `/` in ids. Job ids are Manager's: it expands a bundle into
//! one job per replica and job name and returns their ids, which the operator uses as given
//! (the mirror's job records carry bundle, replica and job name), so no job id is built or
//! parsed here.

use std::fmt;

/// Manager's bound on ids (bundle, job and node ids, tag values).
pub const MAX_MANAGER_ID: usize = 253;

/// Manager's bundle id of a Bundle object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundleId(String);

impl BundleId {
    /// The id of the Bundle `name` in `namespace`.
    pub fn of(namespace: &str, name: &str) -> Self {
        BundleId(format!("{namespace}.{name}"))
    }

    /// Reads an id Manager reports; `None` when it is not one of the operator's (no dot, or an
    /// empty namespace or name).
    pub fn parse(id: &str) -> Option<Self> {
        let (ns, name) = id.split_once('.')?;
        (!ns.is_empty() && !name.is_empty()).then(|| BundleId(id.to_owned()))
    }

    /// The Bundle object, as `(namespace, name)`.
    pub fn object(&self) -> (&str, &str) {
        self.0.split_once('.').unwrap_or(("", &self.0))
    }

    /// The id as Manager knows it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tag value on a node provisioned for replica `replica` of this bundle.
    pub fn provisioned_for(&self, replica: u32) -> String {
        format!("{}.r{replica}", self.0)
    }
}

impl fmt::Display for BundleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for BundleId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_round_trip_through_the_first_dot() {
        let id = BundleId::of("media", "channel.one");
        assert_eq!(id.as_str(), "media.channel.one");
        assert_eq!(id.object(), ("media", "channel.one"));
        assert_eq!(BundleId::parse("media.channel.one"), Some(id));
        assert_eq!(BundleId::parse("nodot"), None);
        assert_eq!(BundleId::parse(".x"), None);
        assert_eq!(BundleId::parse("x."), None);
    }

    proptest! {
        #[test]
        fn any_namespace_and_name_come_back(ns in "[a-z0-9-]{1,63}", name in "[a-z0-9.-]{1,122}") {
            let id = BundleId::of(&ns, &name);
            prop_assert_eq!(id.object(), (ns.as_str(), name.as_str()));
            prop_assert_eq!(BundleId::parse(id.as_str()), Some(id.clone()));
        }
    }
}
