//! Kelp's configuration model, in one place for every daemon and tool.
//!
//! - [`keys`]: the registry of central-configuration keys (`kelp config set osd
//!   osd_max_backfills 2`): each key's type, default, range, readers and documentation,
//!   written once. The monitors validate `config set` against it, the daemons' config
//!   structs take their defaults from it, `kelp config help` prints it and `docs/CONFIG.md`
//!   is generated from it ([`keys::markdown_table`]).
//! - [`conf_file`]: the schema of `kelp.conf`, the file every daemon and client reads at
//!   start (`[global]` for everyone, `[osd]` for the OSD daemons).
//!
//! A foundation crate (it depends on no other Kelp crate) so that any layer can use it.

pub mod conf_file;
pub mod keys;

pub use conf_file::{ClusterConf, ConfFileError, GlobalSection, OsdSection};
pub use keys::{ConfigValueError, KEYS, KeyDef, Value, ValueKind, key_def, normalize};
