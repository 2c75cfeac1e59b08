//! The tags the operator puts on the nodes it asks Manager for, and reads back.

/// `spare=true` on a hot spare.
pub const SPARE_TAG: &str = "spare";
/// The band a spare is dedicated to (`gold`, `silver`, `bronze`), when its target has `forBand`.
pub const SPARE_BAND_TAG: &str = "spare-band";
/// The HotSpareTarget that provisioned a spare.
pub const SPARE_TARGET_TAG: &str = "automanager.hot-spare-target";
/// What a node was provisioned for: a bundle replica (`<bundle id>.r<replica>`) or a migration
/// target (`migration.<id>`).
pub const PROVISIONED_FOR_TAG: &str = "automanager.provisioned-for";
