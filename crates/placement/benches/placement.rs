// placeholder created by the lead so the workspace parses; the placement helper replaces it.
fn main() {}
