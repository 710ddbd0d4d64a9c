//! The fixed-newstyle handshake: greeting, client flags, then option haggling until the client
//! picks an export (`NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`), aborts or goes away.
//!
//! Every option's data is read whole (at most [`MAX_OPTION_DATA`] bytes; a longer option ends
//! the connection) and parsed by the pure functions in [`crate::wire`]; a malformed option gets
//! `NBD_REP_ERR_INVALID` and haggling goes on, an unknown one `NBD_REP_ERR_UNSUP`. The caller
//! bounds the whole handshake with a timeout.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::debug;

use crate::ConnError;
use crate::device::{BlockDevice, ExportInfo, Exports, OpenError};
use crate::validate::Negotiated;
use crate::wire::{self, info, opt, rep};

/// Longest option data the server reads; plenty for a 4096-byte name and a few queries.
pub const MAX_OPTION_DATA: u32 = 64 << 10;

/// The id the server gives `base:allocation` when a client selects it.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// An export chosen at the end of a successful handshake.
pub(crate) struct Session {
    pub device: Arc<dyn BlockDevice>,
    pub export: String,
    pub negotiated: Negotiated,
}

pub(crate) enum Outcome {
    Transmission(Session),
    Closed,
}

/// Block sizes as advertised: the device's values made consistent with the protocol's rules
/// and capped by the server's payload limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub min: u32,
    pub preferred: u32,
    pub max: u32,
}

/// Makes a device's block sizes valid: minimum a power of two in 1..=64 KiB (else 1),
/// preferred a power of two at least the minimum (else 4096 or the minimum), maximum a
/// multiple of the minimum, at least the minimum and at most `server_max`; preferred is then
/// lowered to fit under the maximum.
pub fn block_sizes(info: &ExportInfo, server_max: u32) -> BlockSizes {
    let min = if info.min_block.is_power_of_two() && info.min_block <= 65536 {
        info.min_block
    } else {
        1
    };
    let mut max = info.max_block.min(server_max).max(min);
    max -= max % min;
    let mut preferred = if info.preferred_block.is_power_of_two() && info.preferred_block >= min {
        info.preferred_block
    } else {
        4096u32.max(min)
    };
    while preferred > max && preferred > min {
        preferred /= 2;
    }
    BlockSizes {
        min,
        preferred,
        max,
    }
}

/// Transmission flags for an export, given whether structured replies were negotiated.
pub fn transmission_flags(info: &ExportInfo, structured: bool) -> u16 {
    use wire::tflag::*;
    let mut f = HAS_FLAGS | SEND_FLUSH | SEND_CACHE;
    if info.read_only {
        f |= READ_ONLY;
    } else {
        f |= SEND_FUA | SEND_WRITE_ZEROES;
        if info.can_trim {
            f |= SEND_TRIM;
        }
    }
    if structured {
        f |= SEND_DF;
    }
    if info.multi_conn {
        f |= CAN_MULTI_CONN;
    }
    f
}

struct State {
    no_zeroes: bool,
    structured: bool,
    /// Export named in the last `NBD_OPT_SET_META_CONTEXT`, and whether it selected
    /// `base:allocation`.
    meta: Option<(String, bool)>,
}

async fn send<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    reply: u32,
    data: &[u8],
) -> Result<(), ConnError> {
    w.write_all(&wire::option_reply(option, reply, data))
        .await?;
    Ok(())
}

async fn send_err<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    reply: u32,
    msg: &str,
) -> Result<(), ConnError> {
    debug!(
        option,
        reply = format_args!("{reply:#x}"),
        msg,
        "option refused"
    );
    send(
        w,
        option,
        reply,
        wire::truncate_str(msg, wire::MAX_STRING).as_bytes(),
    )
    .await
}

fn open_error_reply(e: &OpenError) -> u32 {
    match e {
        OpenError::NotFound(_) => rep::ERR_UNKNOWN,
        OpenError::Unavailable(_) => rep::ERR_POLICY,
        OpenError::Invalid(_) => rep::ERR_INVALID,
    }
}

/// Runs the handshake on a fresh connection.
pub(crate) async fn handshake<R, W>(
    r: &mut R,
    w: &mut W,
    exports: &dyn Exports,
    server_max: u32,
    stopping: &watch::Receiver<bool>,
) -> Result<Outcome, ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    w.write_all(&wire::greeting()).await?;
    w.flush().await?;
    let client_flags = r.read_u32().await?;
    if client_flags & !(wire::FLAG_C_FIXED_NEWSTYLE | wire::FLAG_C_NO_ZEROES) != 0 {
        return Err(ConnError::ClientFlags(client_flags));
    }
    let mut st = State {
        no_zeroes: client_flags & wire::FLAG_C_NO_ZEROES != 0,
        structured: false,
        meta: None,
    };
    loop {
        let mut hdr = [0u8; wire::OPTION_HEADER_LEN];
        r.read_exact(&mut hdr).await?;
        let h = wire::OptionHeader::decode(&hdr)?;
        if h.len > MAX_OPTION_DATA {
            return Err(ConnError::OptionTooLong {
                option: h.option,
                len: h.len,
            });
        }
        let mut data = vec![0u8; h.len as usize];
        r.read_exact(&mut data).await?;
        if *stopping.borrow() {
            if h.option == opt::EXPORT_NAME {
                return Ok(Outcome::Closed);
            }
            if h.option != opt::ABORT {
                send_err(
                    w,
                    h.option,
                    rep::ERR_SHUTDOWN,
                    "the server is shutting down",
                )
                .await?;
                w.flush().await?;
                continue;
            }
        }
        let done = handle_option(w, exports, server_max, &mut st, h.option, &data).await?;
        w.flush().await?;
        if let Some(outcome) = done {
            return Ok(outcome);
        }
    }
}

async fn handle_option<W>(
    w: &mut W,
    exports: &dyn Exports,
    server_max: u32,
    st: &mut State,
    option: u32,
    data: &[u8],
) -> Result<Option<Outcome>, ConnError>
where
    W: AsyncWrite + Unpin,
{
    match option {
        opt::EXPORT_NAME => {
            let name = wire::parse_export_name(data).map_err(ConnError::BadExportName)?;
            // This option cannot report an error: a refusal closes the connection.
            let device = exports
                .open(&name)
                .await
                .map_err(|e| ConnError::ExportRefused(name.clone(), e))?;
            let session = session(st, device, name, server_max);
            let flags = transmission_flags(&session.device.info(), st.structured);
            w.write_all(&wire::export_name_reply(
                session.negotiated.size,
                flags,
                st.no_zeroes,
            ))
            .await?;
            Ok(Some(Outcome::Transmission(session)))
        }
        opt::ABORT => {
            // The client may already be gone; that is fine.
            let _ = send(w, option, rep::ACK, &[]).await;
            let _ = w.flush().await;
            Ok(Some(Outcome::Closed))
        }
        opt::LIST => {
            if !data.is_empty() {
                send_err(w, option, rep::ERR_INVALID, "NBD_OPT_LIST takes no data").await?;
                return Ok(None);
            }
            match exports.list().await {
                Ok(list) => {
                    for (name, description) in list {
                        send(
                            w,
                            option,
                            rep::SERVER,
                            &wire::server_entry(&name, &description),
                        )
                        .await?;
                    }
                    send(w, option, rep::ACK, &[]).await?;
                }
                Err(e) => send_err(w, option, open_error_reply(&e), &e.to_string()).await?,
            }
            Ok(None)
        }
        opt::STARTTLS => {
            send_err(
                w,
                option,
                rep::ERR_POLICY,
                "TLS is not supported by this server",
            )
            .await?;
            Ok(None)
        }
        opt::STRUCTURED_REPLY => {
            if !data.is_empty() {
                send_err(
                    w,
                    option,
                    rep::ERR_INVALID,
                    "NBD_OPT_STRUCTURED_REPLY takes no data",
                )
                .await?;
                return Ok(None);
            }
            st.structured = true;
            send(w, option, rep::ACK, &[]).await?;
            Ok(None)
        }
        opt::INFO | opt::GO => {
            let req = match wire::parse_info_request(data) {
                Ok(req) => req,
                Err(e) => {
                    send_err(w, option, rep::ERR_INVALID, &e.to_string()).await?;
                    return Ok(None);
                }
            };
            let device = match exports.open(&req.name).await {
                Ok(d) => d,
                Err(e) => {
                    send_err(w, option, open_error_reply(&e), &e.to_string()).await?;
                    return Ok(None);
                }
            };
            let info = device.info();
            let sizes = block_sizes(&info, server_max);
            let flags = transmission_flags(&info, st.structured);
            send(w, option, rep::INFO, &wire::info_export(info.size, flags)).await?;
            if req.requests.contains(&info::NAME) {
                send(
                    w,
                    option,
                    rep::INFO,
                    &wire::info_string(info::NAME, &req.name),
                )
                .await?;
            }
            if req.requests.contains(&info::DESCRIPTION) && !info.description.is_empty() {
                send(
                    w,
                    option,
                    rep::INFO,
                    &wire::info_string(info::DESCRIPTION, &info.description),
                )
                .await?;
            }
            // Always sent: clients that did not ask may use it, and the sizes are advisory
            // except for the maximum, which the server enforces on reads and writes.
            send(
                w,
                option,
                rep::INFO,
                &wire::info_block_size(sizes.min, sizes.preferred, sizes.max),
            )
            .await?;
            send(w, option, rep::ACK, &[]).await?;
            if option == opt::INFO {
                return Ok(None);
            }
            Ok(Some(Outcome::Transmission(session(
                st, device, req.name, server_max,
            ))))
        }
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
            let set = option == opt::SET_META_CONTEXT;
            if set {
                // Whatever happens below, an earlier selection no longer holds.
                st.meta = None;
            }
            if !st.structured {
                send_err(
                    w,
                    option,
                    rep::ERR_INVALID,
                    "negotiate structured replies first",
                )
                .await?;
                return Ok(None);
            }
            let req = match wire::parse_meta_context_request(data) {
                Ok(req) => req,
                Err(e) => {
                    send_err(w, option, rep::ERR_INVALID, &e.to_string()).await?;
                    return Ok(None);
                }
            };
            let mut selects = !set && req.queries.is_empty();
            for q in &req.queries {
                match wire::query_selects_base_allocation(q) {
                    Some(hit) => selects |= hit,
                    None => {
                        send_err(w, option, rep::ERR_INVALID, &format!("bad query {q:?}")).await?;
                        return Ok(None);
                    }
                }
            }
            let device = match exports.open(&req.export).await {
                Ok(d) => d,
                Err(e) => {
                    send_err(w, option, open_error_reply(&e), &e.to_string()).await?;
                    return Ok(None);
                }
            };
            let selected = selects && device.info().block_status;
            if selected {
                let id = if set { BASE_ALLOCATION_ID } else { 0 };
                send(
                    w,
                    option,
                    rep::META_CONTEXT,
                    &wire::meta_context_entry(id, wire::BASE_ALLOCATION),
                )
                .await?;
            }
            if set {
                st.meta = Some((req.export, selected));
            }
            send(w, option, rep::ACK, &[]).await?;
            Ok(None)
        }
        other => {
            send_err(
                w,
                other,
                rep::ERR_UNSUP,
                &format!("option {other} is not supported"),
            )
            .await?;
            Ok(None)
        }
    }
}

fn session(st: &State, device: Arc<dyn BlockDevice>, export: String, server_max: u32) -> Session {
    let info = device.info();
    let sizes = block_sizes(&info, server_max);
    let base_allocation = st.structured
        && info.block_status
        && st
            .meta
            .as_ref()
            .is_some_and(|(name, selected)| *selected && *name == export);
    Session {
        negotiated: Negotiated {
            size: info.size,
            read_only: info.read_only,
            can_trim: info.can_trim,
            structured: st.structured,
            base_allocation,
            max_payload: sizes.max,
        },
        device,
        export,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(min: u32, preferred: u32, max: u32) -> ExportInfo {
        ExportInfo {
            size: 1 << 30,
            read_only: false,
            can_trim: true,
            block_status: true,
            multi_conn: true,
            min_block: min,
            preferred_block: preferred,
            max_block: max,
            description: String::new(),
        }
    }

    #[test]
    fn block_sizes_are_made_consistent() {
        let s = |min, pref, max, cap| block_sizes(&info(min, pref, max), cap);
        assert_eq!(
            s(512, 4096, 32 << 20, 32 << 20),
            BlockSizes {
                min: 512,
                preferred: 4096,
                max: 32 << 20
            }
        );
        // Capped by the server, preferred lowered under the maximum.
        assert_eq!(
            s(1, 1 << 20, 64 << 20, 512 << 10),
            BlockSizes {
                min: 1,
                preferred: 512 << 10,
                max: 512 << 10
            }
        );
        // Nonsense from a device is repaired, not passed on.
        assert_eq!(
            s(3, 5, 1000, 32 << 20),
            BlockSizes {
                min: 1,
                preferred: 1000u32.next_power_of_two() / 2,
                max: 1000
            }
        );
        assert_eq!(
            s(4096, 512, 10_000, 32 << 20),
            BlockSizes {
                min: 4096,
                preferred: 4096,
                max: 8192
            }
        );
        assert_eq!(
            s(4096, 4096, 0, 32 << 20),
            BlockSizes {
                min: 4096,
                preferred: 4096,
                max: 4096
            }
        );
    }

    #[test]
    fn flags_follow_the_export() {
        use wire::tflag::*;
        let rw = transmission_flags(&info(1, 4096, 1 << 20), true);
        for f in [
            HAS_FLAGS,
            SEND_FLUSH,
            SEND_FUA,
            SEND_TRIM,
            SEND_WRITE_ZEROES,
            SEND_DF,
            CAN_MULTI_CONN,
            SEND_CACHE,
        ] {
            assert_ne!(rw & f, 0, "{f:#x}");
        }
        assert_eq!(rw & READ_ONLY, 0);
        let mut ro = info(1, 4096, 1 << 20);
        ro.read_only = true;
        ro.multi_conn = false;
        let f = transmission_flags(&ro, false);
        assert_ne!(f & READ_ONLY, 0);
        for off in [
            SEND_FUA,
            SEND_TRIM,
            SEND_WRITE_ZEROES,
            SEND_DF,
            CAN_MULTI_CONN,
        ] {
            assert_eq!(f & off, 0, "{off:#x}");
        }
    }
}
