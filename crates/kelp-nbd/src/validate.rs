//! Request checking: every transmission request is turned into a [`Command`] or a
//! [`Rejection`] here, before anything reaches a device. Pure: it sees only the header and what
//! was negotiated, so unit tests and the fuzz test cover every rule.
//!
//! Rules (errors are NBD error numbers):
//! - unknown command, or a command flag not defined for the command → `EINVAL`;
//! - a command whose transmission flag was not advertised (trim on a device without trim,
//!   block status without a negotiated `base:allocation` context, `DF` without structured
//!   replies) → `EINVAL`;
//! - write, trim or write-zeroes on a read-only export → `EPERM`;
//! - length 0 → `EINVAL` (except flush, cache-less commands that take none);
//! - a range past the export's end → `ENOSPC` for write and write-zeroes (as the protocol
//!   recommends), `EINVAL` otherwise;
//! - a read or write longer than the payload limit (the advertised maximum block size) →
//!   `EINVAL`. Commands without a payload (trim, write-zeroes, block status, cache) may be as
//!   long as 32 bits allow, as clients such as QEMU send them;
//! - `NBD_CMD_FLUSH` with a non-zero offset or length → `EINVAL`.
//!
//! A rejected write's payload still follows its header: the connection reads and discards it
//! (in constant memory) when it is at most [`DISCARD_LIMIT`] bytes, and otherwise sends the
//! error and closes the connection, since reading gigabytes of junk helps nobody.

use crate::wire::{cmd, cmd_flag, errno};

/// Largest rejected write payload the server reads and throws away to stay in step with the
/// client; a larger one ends the connection after the error reply.
pub const DISCARD_LIMIT: u32 = 64 << 20;

/// What the handshake settled that request checking depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub size: u64,
    pub read_only: bool,
    pub can_trim: bool,
    pub structured: bool,
    /// `base:allocation` was selected with `NBD_OPT_SET_META_CONTEXT` for this export.
    pub base_allocation: bool,
    /// Largest read or write (bytes).
    pub max_payload: u32,
}

/// A request that passed every check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u32,
        df: bool,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    },
    BlockStatus {
        offset: u64,
        len: u32,
        req_one: bool,
    },
    Cache {
        offset: u64,
        len: u32,
    },
    Disconnect,
}

/// A request refused before it reached the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub errno: u32,
    pub reason: String,
}

/// What to do with the bytes that follow a header (only writes carry any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Nothing follows.
    None,
    /// `len` bytes follow and are the write's data.
    Accept(u32),
    /// `len` bytes follow and must be read and dropped (the write was rejected).
    Discard(u32),
    /// Too much follows to bother: reply with the error, then close the connection.
    Disconnect,
}

/// The checked request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    pub outcome: Result<Command, Rejection>,
    pub payload: Payload,
}

fn reject(errno: u32, reason: impl Into<String>) -> Result<Command, Rejection> {
    Err(Rejection {
        errno,
        reason: reason.into(),
    })
}

/// Checks one request header against what was negotiated.
pub fn check_request(typ: u16, flags: u16, offset: u64, len: u32, n: &Negotiated) -> Checked {
    let outcome = check(typ, flags, offset, len, n);
    let payload = match (typ, &outcome) {
        (cmd::WRITE, Ok(_)) => Payload::Accept(len),
        (cmd::WRITE, Err(_)) if len == 0 => Payload::None,
        (cmd::WRITE, Err(_)) if len <= DISCARD_LIMIT => Payload::Discard(len),
        (cmd::WRITE, Err(_)) => Payload::Disconnect,
        _ => Payload::None,
    };
    Checked { outcome, payload }
}

fn check(
    typ: u16,
    flags: u16,
    offset: u64,
    len: u32,
    n: &Negotiated,
) -> Result<Command, Rejection> {
    // FUA is accepted on every command (the protocol requires that once SEND_FUA is
    // advertised, and it is harmless where nothing is written).
    let allowed = cmd_flag::FUA
        | match typ {
            cmd::READ if n.structured => cmd_flag::DF,
            cmd::WRITE_ZEROES => cmd_flag::NO_HOLE,
            cmd::BLOCK_STATUS => cmd_flag::REQ_ONE,
            cmd::READ | cmd::WRITE | cmd::DISC | cmd::FLUSH | cmd::TRIM | cmd::CACHE => 0,
            other => return reject(errno::EINVAL, format!("unknown command {other}")),
        };
    if flags & !allowed != 0 {
        return reject(
            errno::EINVAL,
            format!(
                "flags {:#06x} not valid for {}",
                flags & !allowed,
                crate::wire::CmdName(typ)
            ),
        );
    }
    let fua = flags & cmd_flag::FUA != 0;
    let writes = matches!(typ, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    match typ {
        cmd::DISC => return Ok(Command::Disconnect),
        cmd::FLUSH => {
            if offset != 0 || len != 0 {
                return reject(errno::EINVAL, "flush with non-zero offset or length");
            }
            return Ok(Command::Flush);
        }
        cmd::TRIM if !n.can_trim && !n.read_only => {
            return reject(errno::EINVAL, "trim is not supported by this export");
        }
        cmd::BLOCK_STATUS if !n.base_allocation => {
            return reject(
                errno::EINVAL,
                "block status without a negotiated metadata context",
            );
        }
        _ => {}
    }
    if writes && n.read_only {
        return reject(errno::EPERM, "the export is read-only");
    }
    if len == 0 {
        return reject(errno::EINVAL, "zero-length request");
    }
    let in_range = offset
        .checked_add(u64::from(len))
        .is_some_and(|end| end <= n.size);
    if !in_range {
        let e = if matches!(typ, cmd::WRITE | cmd::WRITE_ZEROES) {
            errno::ENOSPC
        } else {
            errno::EINVAL
        };
        return reject(
            e,
            format!(
                "range {offset}+{len} is beyond the export's end ({})",
                n.size
            ),
        );
    }
    if matches!(typ, cmd::READ | cmd::WRITE) && len > n.max_payload {
        return reject(
            errno::EINVAL,
            format!(
                "length {len} exceeds the maximum block size {}",
                n.max_payload
            ),
        );
    }
    Ok(match typ {
        cmd::READ => Command::Read {
            offset,
            len,
            df: flags & cmd_flag::DF != 0,
        },
        cmd::WRITE => Command::Write { offset, len, fua },
        cmd::TRIM => Command::Trim { offset, len, fua },
        cmd::WRITE_ZEROES => Command::WriteZeroes {
            offset,
            len,
            fua,
            no_hole: flags & cmd_flag::NO_HOLE != 0,
        },
        cmd::BLOCK_STATUS => Command::BlockStatus {
            offset,
            len,
            req_one: flags & cmd_flag::REQ_ONE != 0,
        },
        cmd::CACHE => Command::Cache { offset, len },
        _ => unreachable!("every other command returned above"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: Negotiated = Negotiated {
        size: 1 << 20,
        read_only: false,
        can_trim: true,
        structured: true,
        base_allocation: true,
        max_payload: 64 << 10,
    };

    fn errno_of(c: &Checked) -> Option<u32> {
        c.outcome.as_ref().err().map(|r| r.errno)
    }

    #[test]
    fn good_requests_pass() {
        let c = check_request(cmd::READ, cmd_flag::DF, 0, 4096, &N);
        assert_eq!(
            c.outcome,
            Ok(Command::Read {
                offset: 0,
                len: 4096,
                df: true
            })
        );
        assert_eq!(c.payload, Payload::None);
        let c = check_request(cmd::WRITE, cmd_flag::FUA, (1 << 20) - 512, 512, &N);
        assert_eq!(
            c.outcome,
            Ok(Command::Write {
                offset: (1 << 20) - 512,
                len: 512,
                fua: true
            })
        );
        assert_eq!(c.payload, Payload::Accept(512));
        let c = check_request(cmd::WRITE_ZEROES, cmd_flag::NO_HOLE, 0, 1 << 20, &N);
        assert_eq!(
            c.outcome,
            Ok(Command::WriteZeroes {
                offset: 0,
                len: 1 << 20,
                fua: false,
                no_hole: true
            })
        );
        assert_eq!(
            check_request(cmd::FLUSH, 0, 0, 0, &N).outcome,
            Ok(Command::Flush)
        );
        assert_eq!(
            check_request(cmd::DISC, 0, 0, 0, &N).outcome,
            Ok(Command::Disconnect)
        );
        // Payload-less commands may exceed the payload limit.
        assert!(check_request(cmd::TRIM, 0, 0, 1 << 20, &N).outcome.is_ok());
        assert!(
            check_request(cmd::BLOCK_STATUS, cmd_flag::REQ_ONE, 0, 1 << 20, &N)
                .outcome
                .is_ok()
        );
        assert!(check_request(cmd::CACHE, 0, 0, 1 << 20, &N).outcome.is_ok());
    }

    #[test]
    fn bounds_and_lengths() {
        assert_eq!(
            errno_of(&check_request(cmd::READ, 0, 0, 0, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::READ, 0, 1 << 20, 1, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::READ, 0, u64::MAX, 1, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::TRIM, 0, (1 << 20) - 1, 2, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::BLOCK_STATUS, 0, 1 << 20, 512, &N)),
            Some(errno::EINVAL)
        );
        let c = check_request(cmd::WRITE, 0, 1 << 20, 512, &N);
        assert_eq!(errno_of(&c), Some(errno::ENOSPC));
        assert_eq!(c.payload, Payload::Discard(512));
        assert_eq!(
            errno_of(&check_request(cmd::WRITE_ZEROES, 0, u64::MAX - 1, 2, &N)),
            Some(errno::ENOSPC)
        );
        // Over the payload limit.
        assert_eq!(
            errno_of(&check_request(cmd::READ, 0, 0, (64 << 10) + 1, &N)),
            Some(errno::EINVAL)
        );
        let c = check_request(cmd::WRITE, 0, 0, (64 << 10) + 1, &N);
        assert_eq!(errno_of(&c), Some(errno::EINVAL));
        assert_eq!(c.payload, Payload::Discard((64 << 10) + 1));
        let c = check_request(cmd::WRITE, 0, 0, u32::MAX, &N);
        assert_eq!(c.payload, Payload::Disconnect);
        let c = check_request(cmd::WRITE, 0, 0, 0, &N);
        assert_eq!(errno_of(&c), Some(errno::EINVAL));
        assert_eq!(c.payload, Payload::None);
    }

    #[test]
    fn flags_and_commands() {
        assert_eq!(
            errno_of(&check_request(99, 0, 0, 1, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::READ, cmd_flag::NO_HOLE, 0, 1, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::WRITE, cmd_flag::DF, 0, 1, &N)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(
                cmd::WRITE_ZEROES,
                cmd_flag::FAST_ZERO,
                0,
                1,
                &N
            )),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::READ, 1 << 15, 0, 1, &N)),
            Some(errno::EINVAL)
        );
        let simple = Negotiated {
            structured: false,
            base_allocation: false,
            ..N
        };
        assert_eq!(
            errno_of(&check_request(cmd::READ, cmd_flag::DF, 0, 1, &simple)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::BLOCK_STATUS, 0, 0, 1, &simple)),
            Some(errno::EINVAL)
        );
        let no_trim = Negotiated {
            can_trim: false,
            ..N
        };
        assert_eq!(
            errno_of(&check_request(cmd::TRIM, 0, 0, 1, &no_trim)),
            Some(errno::EINVAL)
        );
        assert_eq!(
            errno_of(&check_request(cmd::FLUSH, 0, 1, 0, &N)),
            Some(errno::EINVAL)
        );
        // A rejected write still has its payload to consume.
        assert_eq!(check_request(99, 0, 0, 10, &N).payload, Payload::None);
        assert_eq!(
            check_request(cmd::WRITE, 1 << 14, 0, 10, &N).payload,
            Payload::Discard(10)
        );
    }

    #[test]
    fn read_only_exports_refuse_writes() {
        let ro = Negotiated {
            read_only: true,
            ..N
        };
        for typ in [cmd::WRITE, cmd::TRIM, cmd::WRITE_ZEROES] {
            assert_eq!(
                errno_of(&check_request(typ, 0, 0, 512, &ro)),
                Some(errno::EPERM),
                "{typ}"
            );
        }
        let ro_no_trim = Negotiated {
            can_trim: false,
            ..ro
        };
        assert_eq!(
            errno_of(&check_request(cmd::TRIM, 0, 0, 512, &ro_no_trim)),
            Some(errno::EPERM)
        );
        assert!(check_request(cmd::READ, 0, 0, 512, &ro).outcome.is_ok());
        assert!(check_request(cmd::FLUSH, 0, 0, 0, &ro).outcome.is_ok());
    }

    proptest::proptest! {
        #[test]
        fn accepted_requests_are_in_bounds(typ in 0u16..10, flags in proptest::num::u16::ANY,
                                           offset in proptest::num::u64::ANY, len in proptest::num::u32::ANY,
                                           small in proptest::bool::ANY) {
            let offset = if small { offset % (2 << 20) } else { offset };
            let c = check_request(typ, flags, offset, len, &N);
            match c.outcome {
                Ok(Command::Read { offset, len, .. }) | Ok(Command::Write { offset, len, .. }) => {
                    proptest::prop_assert!(len > 0 && len <= N.max_payload && offset + u64::from(len) <= N.size);
                }
                Ok(Command::Trim { offset, len, .. }) | Ok(Command::WriteZeroes { offset, len, .. })
                | Ok(Command::BlockStatus { offset, len, .. }) | Ok(Command::Cache { offset, len }) => {
                    proptest::prop_assert!(len > 0 && offset + u64::from(len) <= N.size);
                }
                Ok(Command::Flush) | Ok(Command::Disconnect) | Err(_) => {}
            }
            if typ != cmd::WRITE {
                proptest::prop_assert_eq!(c.payload, Payload::None);
            }
        }
    }
}
