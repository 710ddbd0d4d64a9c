//! Scrub and repair requests: to a PG's primary (located from the map, like an object op) or
//! to one OSD.

use std::time::Duration;

use bytes::Bytes;
use kelp_proto::{
    ErrorCode, OsdScrubCommand, OsdScrubReply, PgCommand, PgCommandKind, PgCommandReply, decode,
    encode, msg_type,
};
use kelp_types::PgId;

use crate::error::ClientError;
use crate::rados::{PrimaryReply, Rados};

impl PrimaryReply for PgCommandReply {
    const NAME: &'static str = "PgCommandReply";
    fn error(&self) -> Option<&(ErrorCode, String)> {
        self.error.as_ref()
    }
    fn epoch(&self) -> u32 {
        self.epoch
    }
}

impl Rados {
    /// Sends a scrub/repair request or report query to `pg`'s primary (following map changes
    /// and retrying while the PG peers, until the op timeout).
    pub async fn pg_command(
        &self,
        pg: PgId,
        kind: PgCommandKind,
    ) -> Result<PgCommandReply, ClientError> {
        let (reply, _) = self
            .call_primary(
                &format!("{kind:?} on PG {pg}"),
                &pg.to_string(),
                msg_type::OSD_PG_COMMAND,
                |map| {
                    let pool = map
                        .pools
                        .get(&pg.pool.0)
                        .ok_or_else(|| ClientError::NoSuchPool(pg.pool.to_string()))?;
                    if pg.seed >= pool.pg_num {
                        return Err(ClientError::Invalid(format!(
                            "PG {pg} does not exist (pool {} has {} PGs)",
                            pool.name, pool.pg_num
                        )));
                    }
                    Ok(pg)
                },
                |pg, epoch| encode(&PgCommand { pg, epoch, kind }),
                Bytes::new(),
            )
            .await?;
        Ok(reply)
    }

    /// Sends a scrub request or summary query to OSD `osd` (which must be up).
    pub async fn osd_scrub_command(
        &self,
        osd: i32,
        cmd: OsdScrubCommand,
        timeout: Duration,
    ) -> Result<OsdScrubReply, ClientError> {
        let map = self.osd_map();
        let info = map
            .osds
            .get(&osd)
            .ok_or_else(|| ClientError::Invalid(format!("osd.{osd} does not exist")))?;
        let addr = match info.addr {
            Some(a) if info.up => a,
            _ => return Err(ClientError::Io(format!("osd.{osd} is down"))),
        };
        let resp = self
            .msgr()
            .connection(addr)
            .call(
                msg_type::OSD_SCRUB_COMMAND,
                encode(&cmd),
                Bytes::new(),
                timeout,
            )
            .await?;
        let reply: OsdScrubReply = decode(&resp.meta, "OsdScrubReply")?;
        if let Some((code, msg)) = &reply.error {
            return Err(ClientError::from_code(
                *code,
                &format!("osd.{osd}"),
                msg.clone(),
            ));
        }
        Ok(reply)
    }
}
