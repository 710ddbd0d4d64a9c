//! Users, access keys and bucket records (the metadata pool).

use std::collections::BTreeMap;

use kelp_client::{ClientError, ReadOp, ReadResult, WriteOp};

use crate::acl::CannedAcl;
use crate::error::{Result, RgwError, found};
use crate::layout::{
    AccessKey, BUCKETS_OBJ, BucketRecord, USERS_OBJ, UserRecord, bucket_obj, check_bucket_name,
    check_uid, decode, encode, key_obj, now_ns, random_hex, user_buckets_obj, user_obj,
};
use crate::rgw::Rgw;

/// Most index shards a bucket may have.
pub const MAX_SHARDS: u32 = 65_521;

/// A new random key pair: a 20-character access key and a 40-character secret, like AWS's.
pub fn generate_key() -> AccessKey {
    use rand::Rng;
    const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const SECRET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut rng = rand::thread_rng();
    let mut pick = |set: &[u8], n: usize| -> String {
        (0..n)
            .map(|_| set[rng.gen_range(0..set.len())] as char)
            .collect()
    };
    AccessKey {
        access_key: format!("KELP{}", pick(UPPER, 16)),
        secret_key: pick(SECRET, 40),
    }
}

impl Rgw {
    /// Creates a user with one key pair (`key`, or a generated one).
    pub async fn create_user(
        &self,
        uid: &str,
        display_name: &str,
        key: Option<AccessKey>,
    ) -> Result<UserRecord> {
        check_uid(uid).map_err(|why| RgwError::Invalid(format!("user id '{uid}' {why}")))?;
        let key = key.unwrap_or_else(generate_key);
        check_key(&key)?;
        let meta = &self.inner.meta;
        // the key first: a clash leaves nothing behind
        self.claim_key(&key.access_key, uid).await?;
        let user = UserRecord {
            uid: uid.to_string(),
            display_name: display_name.to_string(),
            keys: vec![key.clone()],
            created_ns: now_ns(),
            max_buckets: None,
        };
        let created = meta
            .operate(
                WriteOp::new().create(true).write_full(encode(&user)),
                &user_obj(uid),
            )
            .await;
        if let Err(e) = created {
            let _ = meta.remove(&key_obj(&key.access_key)).await;
            return Err(match e {
                ClientError::Exists { .. } => RgwError::UserExists(uid.to_string()),
                e => e.into(),
            });
        }
        meta.omap_set(USERS_OBJ, &[(uid, b"")]).await?;
        Ok(user)
    }

    async fn claim_key(&self, access_key: &str, uid: &str) -> Result<()> {
        match self
            .inner
            .meta
            .operate(
                WriteOp::new().create(true).write_full(uid.as_bytes()),
                &key_obj(access_key),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(ClientError::Exists { .. }) => Err(RgwError::Invalid(format!(
                "access key '{access_key}' is already in use"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// A user's record and its version (for compare-and-swap updates).
    async fn user_versioned(&self, uid: &str) -> Result<(UserRecord, u64)> {
        read_versioned(&self.inner.meta, &user_obj(uid))
            .await?
            .ok_or_else(|| RgwError::NoSuchUser(uid.to_string()))
    }

    pub async fn user(&self, uid: &str) -> Result<UserRecord> {
        Ok(self.user_versioned(uid).await?.0)
    }

    /// Every user id, in order.
    pub async fn users(&self) -> Result<Vec<String>> {
        let entries = omap_all(&self.inner.meta, USERS_OBJ, "").await?;
        Ok(entries.into_iter().map(|(k, _)| k).collect())
    }

    /// Applies `change` to a user's record with compare-and-swap (retried on a race).
    async fn update_user(
        &self,
        uid: &str,
        mut change: impl FnMut(&mut UserRecord) -> Result<()>,
    ) -> Result<UserRecord> {
        for _ in 0..16 {
            let (mut user, version) = self.user_versioned(uid).await?;
            change(&mut user)?;
            match self
                .inner
                .meta
                .operate(
                    WriteOp::new()
                        .assert_version(version)
                        .write_full(encode(&user)),
                    &user_obj(uid),
                )
                .await
            {
                Ok(_) => return Ok(user),
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(user_obj(uid)))
    }

    /// Adds a key pair (`key`, or a generated one) to a user.
    pub async fn add_key(&self, uid: &str, key: Option<AccessKey>) -> Result<AccessKey> {
        let key = key.unwrap_or_else(generate_key);
        check_key(&key)?;
        self.user(uid).await?;
        self.claim_key(&key.access_key, uid).await?;
        let k = key.clone();
        let r = self
            .update_user(uid, |u| {
                u.keys.push(k.clone());
                Ok(())
            })
            .await;
        if let Err(e) = r {
            let _ = self.inner.meta.remove(&key_obj(&key.access_key)).await;
            return Err(e);
        }
        Ok(key)
    }

    /// Removes an access key from its user.
    pub async fn remove_key(&self, access_key: &str) -> Result<()> {
        let (uid, _) = self.secret_for(access_key).await?;
        self.update_user(&uid, |u| {
            u.keys.retain(|k| k.access_key != access_key);
            Ok(())
        })
        .await?;
        let _ = found(self.inner.meta.remove(&key_obj(access_key)).await)?;
        Ok(())
    }

    /// Removes a user who owns no buckets.
    pub async fn remove_user(&self, uid: &str) -> Result<()> {
        let user = self.user(uid).await?;
        let buckets = self.user_buckets(uid).await?;
        if let Some((b, _)) = buckets.first() {
            return Err(RgwError::Invalid(format!(
                "user '{uid}' still owns {} bucket(s) (first: '{b}'); remove them first",
                buckets.len()
            )));
        }
        for k in &user.keys {
            found(self.inner.meta.remove(&key_obj(&k.access_key)).await)?;
        }
        found(self.inner.meta.remove(&user_obj(uid)).await)?;
        self.inner.meta.omap_rm_keys(USERS_OBJ, &[uid]).await?;
        let _ = found(self.inner.meta.remove(&user_buckets_obj(uid)).await)?;
        Ok(())
    }

    /// The user owning `access_key` and the key's secret.
    pub async fn secret_for(&self, access_key: &str) -> Result<(String, String)> {
        let name = key_obj(access_key);
        let uid = found(self.inner.meta.read(&name, 0, 0).await)?
            .ok_or_else(|| RgwError::NoSuchAccessKey(access_key.to_string()))?;
        let uid = String::from_utf8_lossy(&uid).into_owned();
        let user = match self.user(&uid).await {
            Err(RgwError::NoSuchUser(_)) => {
                return Err(RgwError::NoSuchAccessKey(access_key.to_string()));
            }
            r => r?,
        };
        let key = user
            .keys
            .iter()
            .find(|k| k.access_key == access_key)
            .ok_or_else(|| RgwError::NoSuchAccessKey(access_key.to_string()))?;
        Ok((uid, key.secret_key.clone()))
    }

    /// Creates a bucket owned by `owner` with `shards` index shards (default: the config's) and
    /// the canned ACL `acl`.
    pub async fn create_bucket(
        &self,
        owner: &str,
        name: &str,
        shards: Option<u32>,
        location: &str,
        acl: CannedAcl,
    ) -> Result<BucketRecord> {
        check_bucket_name(name).map_err(|why| RgwError::InvalidBucketName {
            name: name.to_string(),
            why,
        })?;
        let shards = shards.unwrap_or(self.inner.cfg.default_shards);
        if shards == 0 || shards > MAX_SHARDS {
            return Err(RgwError::Invalid(format!(
                "a bucket has 1 to {MAX_SHARDS} index shards, not {shards}"
            )));
        }
        let record = BucketRecord {
            name: name.to_string(),
            id: random_hex(8),
            owner: owner.to_string(),
            created_ns: now_ns(),
            shards,
            location: location.to_string(),
            generation: 0,
            reshard: None,
            retired: Vec::new(),
            versioning: None,
            lifecycle: Vec::new(),
            tags: BTreeMap::new(),
            acl,
            cors: Vec::new(),
        };
        let meta = &self.inner.meta;
        match meta
            .operate(
                WriteOp::new().create(true).write_full(encode(&record)),
                &bucket_obj(name),
            )
            .await
        {
            Ok(_) => {}
            Err(ClientError::Exists { .. }) => {
                let existing = self.bucket(name).await?;
                return Err(if existing.owner == owner {
                    RgwError::BucketOwnedByYou(name.to_string())
                } else {
                    RgwError::BucketExists(name.to_string())
                });
            }
            Err(e) => return Err(e.into()),
        }
        // the index shards exist from the start: index updates require them, so that nothing
        // is ever written into the index of a bucket deleted meanwhile
        let index = &self.inner.index;
        let id = &record.id;
        let made = futures::future::join_all((0..shards).map(|s| async move {
            let obj = crate::layout::shard_obj(id, 0, s);
            index.operate(WriteOp::new().create(false), &obj).await
        }))
        .await;
        for r in made {
            r?;
        }
        let created = record.created_ns.to_string();
        meta.omap_set(&user_buckets_obj(owner), &[(name, created.as_bytes())])
            .await?;
        meta.omap_set(BUCKETS_OBJ, &[(name, owner.as_bytes())])
            .await?;
        self.remember_bucket(&record);
        Ok(record)
    }

    /// Applies `change` to a bucket's record with compare-and-swap (this incarnation only).
    pub async fn update_bucket(
        &self,
        b: &BucketRecord,
        mut change: impl FnMut(&mut BucketRecord),
    ) -> Result<BucketRecord> {
        let obj = bucket_obj(&b.name);
        for _ in 0..16 {
            let (mut cur, version) = read_versioned::<BucketRecord>(&self.inner.meta, &obj)
                .await?
                .ok_or_else(|| RgwError::NoSuchBucket(b.name.clone()))?;
            if cur.id != b.id {
                return Err(RgwError::NoSuchBucket(b.name.clone()));
            }
            change(&mut cur);
            match self
                .inner
                .meta
                .operate(
                    WriteOp::new()
                        .assert_version(version)
                        .write_full(encode(&cur)),
                    &obj,
                )
                .await
            {
                Ok(_) => {
                    self.remember_bucket(&cur);
                    return Ok(cur);
                }
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(obj))
    }

    /// A bucket's record, read now.
    pub async fn bucket(&self, name: &str) -> Result<BucketRecord> {
        let obj = bucket_obj(name);
        let found = found(self.inner.meta.read(&obj, 0, 0).await)?;
        let Some(raw) = found else {
            self.forget_bucket(name);
            return Err(RgwError::NoSuchBucket(name.to_string()));
        };
        let b: BucketRecord = decode(&obj, &raw)?;
        self.remember_bucket(&b);
        Ok(b)
    }

    /// A bucket's record, as read at most `bucket_cache_ttl` ago (S3 requests use this: it
    /// saves a round trip per request). Index updates still check that the bucket's shards
    /// exist, so a deleted bucket is never written to.
    pub async fn bucket_cached(&self, name: &str) -> Result<BucketRecord> {
        let ttl = self.inner.cfg.bucket_cache_ttl;
        if !ttl.is_zero() {
            let cache = self.inner.buckets.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((b, at)) = cache.get(name)
                && at.elapsed() < ttl
            {
                return Ok(b.clone());
            }
        }
        self.bucket(name).await
    }

    pub(crate) fn remember_bucket(&self, b: &BucketRecord) {
        if self.inner.cfg.bucket_cache_ttl.is_zero() {
            return;
        }
        let mut cache = self.inner.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(b.name.clone(), (b.clone(), std::time::Instant::now()));
    }

    pub(crate) fn forget_bucket(&self, name: &str) {
        let mut cache = self.inner.buckets.lock().unwrap_or_else(|p| p.into_inner());
        cache.remove(name);
    }

    /// A user's buckets and their creation times (ns), in name order.
    pub async fn user_buckets(&self, uid: &str) -> Result<Vec<(String, u64)>> {
        let entries = omap_all(&self.inner.meta, &user_buckets_obj(uid), "").await?;
        Ok(entries
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).parse().unwrap_or(0)))
            .collect())
    }

    /// Every bucket and its owner, in name order.
    pub async fn all_buckets(&self) -> Result<Vec<(String, String)>> {
        let entries = omap_all(&self.inner.meta, BUCKETS_OBJ, "").await?;
        Ok(entries
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect())
    }

    /// Forgets a bucket's record (its index and data must be gone already).
    pub(crate) async fn remove_bucket_record(&self, b: &BucketRecord) -> Result<()> {
        self.forget_bucket(&b.name);
        let meta = &self.inner.meta;
        // only this incarnation: a bucket re-created meanwhile keeps its record
        if let Some((current, version)) =
            read_versioned::<BucketRecord>(meta, &bucket_obj(&b.name)).await?
        {
            if current.id != b.id {
                return Ok(());
            }
            match meta
                .operate(
                    WriteOp::new().assert_version(version).remove(),
                    &bucket_obj(&b.name),
                )
                .await
            {
                Ok(_) | Err(ClientError::NotFound { .. }) => {}
                Err(ClientError::Canceled { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        meta.omap_rm_keys(&user_buckets_obj(&b.owner), &[&b.name])
            .await?;
        meta.omap_rm_keys(BUCKETS_OBJ, &[&b.name]).await?;
        Ok(())
    }
}

fn check_key(key: &AccessKey) -> Result<()> {
    let printable =
        |s: &str| !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
    if !printable(&key.access_key) || key.access_key.contains('/') || !printable(&key.secret_key) {
        return Err(RgwError::Invalid(
            "access keys are 1 to 128 printable characters without '/'; secrets 1 to 128 \
             printable characters"
                .into(),
        ));
    }
    Ok(())
}

/// A JSON record stored as an object's data, with the object's version.
pub(crate) async fn read_versioned<T: for<'de> serde::Deserialize<'de>>(
    io: &kelp_client::IoCtx,
    name: &str,
) -> Result<Option<(T, u64)>> {
    let Some(res) = found(io.operate_read(ReadOp::new().stat().read(0, 0), name).await)? else {
        return Ok(None);
    };
    match (res.first(), res.get(1)) {
        (Some(ReadResult::Stat { version, .. }), Some(ReadResult::Data(raw))) => {
            Ok(Some((decode(name, raw)?, *version)))
        }
        _ => Err(RgwError::Corrupt {
            object: name.to_string(),
            message: "unexpected read result".into(),
        }),
    }
}

/// Every omap entry of `obj` starting with `prefix` (empty if the object does not exist).
pub(crate) async fn omap_all(
    io: &kelp_client::IoCtx,
    obj: &str,
    prefix: &str,
) -> Result<Vec<(String, bytes::Bytes)>> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let page = match io.omap_get_vals(obj, &after, prefix, 1000).await {
            Ok(p) => p,
            Err(ClientError::NotFound { .. }) => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        let (entries, more) = page;
        if let Some((k, _)) = entries.last() {
            after = k.clone();
        }
        let n = entries.len();
        out.extend(entries);
        if !more || n == 0 {
            return Ok(out);
        }
    }
}
