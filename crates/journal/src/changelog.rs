pub struct Changelog;
