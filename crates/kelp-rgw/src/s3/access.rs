//! Who may do what through S3: the canned ACLs of buckets and objects (see [`crate::acl`]),
//! enforced here, and the ACL operations (Get/PutBucketAcl, Get/PutObjectAcl).
//!
//! Anonymous requests reach only the operations an ACL can open ([`ANONYMOUS_OPS`]), and
//! only on buckets whose ACL opens them; [`KelpAccess`] refuses the rest before `s3s` reads
//! their body. Requests by other users of the
//! cluster reach every operation and are refused in the handler unless the owner granted them
//! what they ask: owner-only operations (bucket deletion, configuration, tagging, ACLs) go
//! through `KelpS3::owned`, the rest through [`KelpS3::bucket_for`] and [`KelpS3::may_read`].

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::Credentials;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use super::{KelpAuth, KelpS3, s3_err};
use crate::acl::{
    ALL_USERS_URI, AUTHENTICATED_USERS_URI, Access, AclError, CannedAcl, Grantee as AclGrantee,
    Permission as AclPermission, Requester,
};
use crate::layout::{BucketRecord, IndexEntry};
use crate::rgw::Rgw;
use crate::unsupported::{self, BucketCheck, Refusal, Resource};
use s3s::path::S3Path;

/// Operations an anonymous request may reach, and what the bucket's ACL must grant everyone
/// for them (`None`: the object's own ACL decides). Each handler checks the ACLs again.
pub const ANONYMOUS_OPS: &[(&str, Option<Access>)] = &[
    ("HeadBucket", Some(Access::Read)),
    ("ListObjects", Some(Access::Read)),
    ("ListObjectsV2", Some(Access::Read)),
    ("ListMultipartUploads", Some(Access::Read)),
    ("GetObject", None),
    ("HeadObject", None),
    ("PutObject", Some(Access::Write)),
    ("PostObject", Some(Access::Write)),
    ("CopyObject", Some(Access::Write)),
    ("DeleteObject", Some(Access::Write)),
    ("DeleteObjects", Some(Access::Write)),
    ("CreateMultipartUpload", Some(Access::Write)),
    ("UploadPart", Some(Access::Write)),
    ("UploadPartCopy", Some(Access::Write)),
    ("ListParts", Some(Access::Write)),
    ("CompleteMultipartUpload", Some(Access::Write)),
    ("AbortMultipartUpload", Some(Access::Write)),
];

/// The `s3s` access hook, run after the signature check and before a request's body is
/// read:
///
/// * anonymous requests go only to the operations an ACL can open to everyone, and (but
///   for object reads) only when the bucket's ACL does, so that nobody can make the gateway
///   read a body for a request that will be refused;
/// * every request asking for something the gateway does not do is refused
///   ([`crate::unsupported`]), so nothing of it is stored;
/// * `x-amz-expected-bucket-owner` (and `x-amz-source-expected-bucket-owner` of a copy) must
///   name the bucket's owner: `AccessDenied` otherwise, as AWS answers.
pub struct KelpAccess {
    rgw: Rgw,
    auth: KelpAuth,
}

impl KelpAccess {
    pub fn new(rgw: Rgw, auth: KelpAuth) -> KelpAccess {
        KelpAccess { rgw, auth }
    }

    async fn anonymous(&self, cx: &S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name();
        let Some((_, need)) = ANONYMOUS_OPS.iter().find(|(name, _)| *name == op) else {
            return Err(s3_error!(AccessDenied, "anonymous access is not allowed"));
        };
        let (Some(need), Some(bucket)) = (need, cx.s3_path().get_bucket_name()) else {
            return Ok(());
        };
        match self.rgw.bucket_cached(bucket).await {
            Ok(b) if !b.acl.allows(&b.owner, &Requester::Anonymous, *need) => Err(denied()),
            // allowed, or an error the handler reports (NoSuchBucket…)
            _ => Ok(()),
        }
    }

    /// The answer to a refused request, after what it needs to know of the bucket.
    async fn refuse(&self, cx: &S3AccessContext<'_>, r: Refusal) -> s3s::S3Error {
        let check = r.bucket_check();
        if let (true, Some(bucket)) = (check != BucketCheck::None, cx.s3_path().get_bucket_name()) {
            let b = match self.rgw.bucket_cached(bucket).await {
                Ok(b) => b,
                Err(e) => return s3_err(e),
            };
            if check == BucketCheck::Owner {
                let uid = match cx.credentials() {
                    Some(c) => match self.auth.lookup(&c.access_key).await {
                        Ok((uid, _)) => Some(uid),
                        Err(e) => return e,
                    },
                    None => None,
                };
                if uid.as_deref() != Some(b.owner.as_str()) {
                    return denied();
                }
            }
        }
        r.into()
    }

    /// `AccessDenied` if `expected` does not name the owner of `bucket` (a missing bucket is
    /// left to the handler, which answers `NoSuchBucket`).
    async fn expect_owner(&self, bucket: &str, expected: Option<&str>) -> S3Result<()> {
        let Some(expected) = expected else {
            return Ok(());
        };
        match self.rgw.bucket_cached(bucket).await {
            Ok(b) if b.owner != expected => Err(denied()),
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl S3Access for KelpAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_none() {
            self.anonymous(cx).await?;
        }
        let resource = match cx.s3_path() {
            S3Path::Root => Resource::Service,
            S3Path::Bucket { .. } => Resource::Bucket,
            S3Path::Object { .. } => Resource::Object,
        };
        if let Some(r) = unsupported::check(cx.method(), resource, cx.uri().query(), cx.headers()) {
            return Err(self.refuse(cx, r).await);
        }
        let header = |name: &str| cx.headers().get(name).and_then(|v| v.to_str().ok());
        if let Some(bucket) = cx.s3_path().get_bucket_name() {
            self.expect_owner(bucket, header("x-amz-expected-bucket-owner"))
                .await?;
        }
        if let Some(src) = header("x-amz-copy-source") {
            let src = src.strip_prefix('/').unwrap_or(src);
            let bucket = src.split('/').next().unwrap_or_default();
            let bucket = percent_encoding::percent_decode_str(bucket).decode_utf8_lossy();
            self.expect_owner(&bucket, header("x-amz-source-expected-bucket-owner"))
                .await?;
        }
        Ok(())
    }
}

fn denied() -> s3s::S3Error {
    s3_error!(AccessDenied, "Access Denied")
}

/// An `x-amz-acl` value for a bucket (none: private).
pub(super) fn bucket_acl(acl: Option<&BucketCannedACL>) -> S3Result<CannedAcl> {
    acl.map_or(Ok(CannedAcl::Private), |a| {
        CannedAcl::for_bucket(a.as_str()).map_err(acl_err)
    })
}

/// An `x-amz-acl` value for an object (none: private).
pub(super) fn object_acl(acl: Option<&str>) -> S3Result<CannedAcl> {
    acl.map_or(Ok(CannedAcl::Private), |a| {
        CannedAcl::for_object(a).map_err(acl_err)
    })
}

fn acl_err(e: AclError) -> s3s::S3Error {
    match e {
        AclError::Unsupported(_) => {
            s3s::S3Error::with_message(S3ErrorCode::NotImplemented, e.to_string())
        }
        AclError::Unknown(_) | AclError::ObjectOnly(_) => {
            s3s::S3Error::with_message(S3ErrorCode::InvalidArgument, e.to_string())
        }
    }
}

/// Refuses `x-amz-grant-*` headers: explicit grant lists are not stored.
pub(super) fn no_grants(grants: &[&Option<String>]) -> S3Result<()> {
    if grants.iter().any(|g| g.is_some()) {
        return Err(s3_error!(
            NotImplemented,
            "x-amz-grant-* headers are not supported; use a canned ACL (x-amz-acl)"
        ));
    }
    Ok(())
}

impl KelpS3 {
    /// Who signed the request (an unknown key was refused by the signature check already).
    pub(super) async fn requester(&self, creds: &Option<Credentials>) -> S3Result<Requester> {
        match creds {
            Some(c) => Ok(Requester::User(self.auth.lookup(&c.access_key).await?.0)),
            None => Ok(Requester::Anonymous),
        }
    }

    /// The bucket and the requester, without deciding anything yet.
    pub(super) async fn requester_bucket(
        &self,
        creds: &Option<Credentials>,
        bucket: &str,
    ) -> S3Result<(BucketRecord, Requester)> {
        let who = self.requester(creds).await?;
        let b = self.rgw.bucket_cached(bucket).await.map_err(s3_err)?;
        Ok((b, who))
    }

    /// The bucket, if the requester may list it (`Read`) or write objects into it (`Write`).
    pub(super) async fn bucket_for(
        &self,
        creds: &Option<Credentials>,
        bucket: &str,
        what: Access,
    ) -> S3Result<BucketRecord> {
        let (b, who) = self.requester_bucket(creds, bucket).await?;
        if !b.acl.allows(&b.owner, &who, what) {
            return Err(denied());
        }
        Ok(b)
    }

    /// `found` (the lookup of an object), if the requester may read that object: the
    /// owner always; others per the object's ACL (one more read: its meta). A missing key
    /// is `NoSuchKey` only to those who may list the bucket, `AccessDenied` to others, as S3
    /// answers.
    pub(super) async fn may_read(
        &self,
        b: &BucketRecord,
        who: &Requester,
        found: S3Result<IndexEntry>,
    ) -> S3Result<IndexEntry> {
        if who.is(&b.owner) {
            return found;
        }
        let e = match found {
            Ok(e) => e,
            Err(err)
                if *err.code() == S3ErrorCode::NoSuchKey
                    && !b.acl.allows(&b.owner, who, Access::Read) =>
            {
                return Err(denied());
            }
            Err(err) => return Err(err),
        };
        let meta = match self.rgw.read_meta(&e.inst).await {
            Ok(m) => m,
            Err(crate::RgwError::Rados(kelp_client::ClientError::NotFound { .. })) => {
                return Err(s3_error!(NoSuchKey, "the object was deleted"));
            }
            Err(err) => return Err(s3_err(err)),
        };
        if !meta.acl.allows(&b.owner, who, Access::Read) {
            return Err(denied());
        }
        Ok(e)
    }

    /// The grants of `acl` as S3 lists them, with the owner's id and display name.
    async fn acl_output(&self, owner_uid: &str, acl: CannedAcl) -> (Grants, Owner) {
        let owner = self.owner(owner_uid).await;
        let grants = acl
            .grants()
            .into_iter()
            .map(|(g, p)| Grant {
                grantee: Some(match g {
                    AclGrantee::Owner => Grantee {
                        display_name: owner.display_name.clone(),
                        id: owner.id.clone(),
                        type_: Type::from_static(Type::CANONICAL_USER),
                        email_address: None,
                        uri: None,
                    },
                    AclGrantee::AllUsers | AclGrantee::AuthenticatedUsers => Grantee {
                        display_name: None,
                        id: None,
                        type_: Type::from_static(Type::GROUP),
                        email_address: None,
                        uri: Some(
                            if g == AclGrantee::AllUsers {
                                ALL_USERS_URI
                            } else {
                                AUTHENTICATED_USERS_URI
                            }
                            .to_string(),
                        ),
                    },
                }),
                permission: Some(Permission::from(p.as_str().to_string())),
            })
            .collect();
        (grants, owner)
    }

    /// The ACL a Put*Acl request asks for: its `x-amz-acl` header, or an
    /// `AccessControlPolicy` body whose grants are exactly those of a canned ACL.
    fn requested_acl(
        &self,
        owner_uid: &str,
        canned: Option<CannedAcl>,
        policy: Option<AccessControlPolicy>,
        grants: &[&Option<String>],
    ) -> S3Result<CannedAcl> {
        no_grants(grants)?;
        match (canned, policy) {
            (Some(_), Some(_)) => Err(s3_error!(
                InvalidRequest,
                "give either x-amz-acl or an AccessControlPolicy, not both"
            )),
            (Some(acl), None) => Ok(acl),
            (None, Some(p)) => policy_to_canned(owner_uid, p),
            (None, None) => Err(s3_error!(
                MissingSecurityHeader,
                "give x-amz-acl or an AccessControlPolicy body"
            )),
        }
    }

    pub(super) async fn do_put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let i = req.input;
        let canned = i.acl.as_ref().map(|a| bucket_acl(Some(a))).transpose()?;
        let acl = self.requested_acl(
            &b.owner,
            canned,
            i.access_control_policy,
            &[
                &i.grant_full_control,
                &i.grant_read,
                &i.grant_read_acp,
                &i.grant_write,
                &i.grant_write_acp,
            ],
        )?;
        self.rgw
            .update_bucket(&b, |r| r.acl = acl)
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(PutBucketAclOutput::default()))
    }

    pub(super) async fn do_get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let (grants, owner) = self.acl_output(&b.owner, b.acl).await;
        Ok(S3Response::new(GetBucketAclOutput {
            grants: Some(grants),
            owner: Some(owner),
        }))
    }

    pub(super) async fn do_put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let i = req.input;
        let canned = i
            .acl
            .as_ref()
            .map(|a| object_acl(Some(a.as_str())))
            .transpose()?;
        let acl = self.requested_acl(
            &b.owner,
            canned,
            i.access_control_policy,
            &[
                &i.grant_full_control,
                &i.grant_read,
                &i.grant_read_acp,
                &i.grant_write,
                &i.grant_write_acp,
            ],
        )?;
        let e = self.current(&b, &i.key, &i.version_id).await?;
        self.rgw
            .update_meta(&e.inst, |m| m.acl = acl)
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    pub(super) async fn do_get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let i = req.input;
        let e = self.current(&b, &i.key, &i.version_id).await?;
        let meta = self.rgw.read_meta(&e.inst).await.map_err(s3_err)?;
        let (grants, owner) = self.acl_output(&b.owner, meta.acl).await;
        Ok(S3Response::new(GetObjectAclOutput {
            grants: Some(grants),
            owner: Some(owner),
            request_charged: None,
        }))
    }
}

/// An `AccessControlPolicy` body as a canned ACL: it must grant the owner FULL_CONTROL and
/// otherwise only what one canned ACL grants (AllUsers / AuthenticatedUsers READ, WRITE).
fn policy_to_canned(owner_uid: &str, p: AccessControlPolicy) -> S3Result<CannedAcl> {
    if let Some(id) = p.owner.as_ref().and_then(|o| o.id.as_deref())
        && id != owner_uid
    {
        return Err(s3_error!(
            AccessDenied,
            "the policy names '{id}' as owner; the owner is '{owner_uid}'"
        ));
    }
    let unsupported = || {
        s3_error!(
            NotImplemented,
            "only ACLs equal to a canned ACL (owner FULL_CONTROL plus AllUsers or \
             AuthenticatedUsers READ/WRITE) are supported"
        )
    };
    let mut grants = Vec::new();
    for g in p.grants.unwrap_or_default() {
        let grantee = g
            .grantee
            .ok_or_else(|| s3_error!(MalformedACLError, "a grant has no grantee"))?;
        let who = match (
            grantee.type_.as_str(),
            grantee.id.as_deref(),
            grantee.uri.as_deref(),
        ) {
            ("CanonicalUser", Some(id), _) if id == owner_uid => AclGrantee::Owner,
            ("Group", _, Some(ALL_USERS_URI)) => AclGrantee::AllUsers,
            ("Group", _, Some(AUTHENTICATED_USERS_URI)) => AclGrantee::AuthenticatedUsers,
            _ => return Err(unsupported()),
        };
        let perm = match g.permission.as_ref().map(|p| p.as_str()) {
            Some("FULL_CONTROL") => AclPermission::FullControl,
            Some("READ") => AclPermission::Read,
            Some("WRITE") => AclPermission::Write,
            Some(_) => return Err(unsupported()),
            None => return Err(s3_error!(MalformedACLError, "a grant has no permission")),
        };
        grants.push((who, perm));
    }
    CannedAcl::from_grants(&grants).ok_or_else(unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(type_: &str, id: Option<&str>, uri: Option<&str>, perm: &str) -> Grant {
        Grant {
            grantee: Some(Grantee {
                display_name: None,
                email_address: None,
                id: id.map(str::to_string),
                type_: Type::from(type_.to_string()),
                uri: uri.map(str::to_string),
            }),
            permission: Some(Permission::from(perm.to_string())),
        }
    }

    fn policy(grants: Vec<Grant>) -> AccessControlPolicy {
        AccessControlPolicy {
            grants: Some(grants),
            owner: Some(Owner {
                id: Some("alice".into()),
                display_name: None,
            }),
        }
    }

    #[test]
    fn policies_equal_to_canned_acls() {
        let owner = grant("CanonicalUser", Some("alice"), None, "FULL_CONTROL");
        let read = grant("Group", None, Some(ALL_USERS_URI), "READ");
        let write = grant("Group", None, Some(ALL_USERS_URI), "WRITE");
        let authn = grant("Group", None, Some(AUTHENTICATED_USERS_URI), "READ");
        let ok = |g: Vec<Grant>| policy_to_canned("alice", policy(g)).ok();
        assert_eq!(ok(vec![owner.clone()]), Some(CannedAcl::Private));
        assert_eq!(
            ok(vec![owner.clone(), read.clone()]),
            Some(CannedAcl::PublicRead)
        );
        assert_eq!(
            ok(vec![write.clone(), owner.clone(), read.clone()]),
            Some(CannedAcl::PublicReadWrite)
        );
        assert_eq!(
            ok(vec![owner.clone(), authn]),
            Some(CannedAcl::AuthenticatedRead)
        );
        // write without read, another user, READ_ACP, no owner grant: not canned
        let not = |g: Vec<Grant>| {
            *policy_to_canned("alice", policy(g)).unwrap_err().code() == S3ErrorCode::NotImplemented
        };
        assert!(not(vec![owner.clone(), write]));
        assert!(not(vec![
            owner.clone(),
            grant("CanonicalUser", Some("bob"), None, "READ")
        ]));
        assert!(not(vec![
            owner.clone(),
            grant("Group", None, Some(ALL_USERS_URI), "READ_ACP")
        ]));
        assert!(not(vec![read]));
        // a policy naming another owner
        assert_eq!(
            *policy_to_canned("bob", policy(vec![owner]))
                .unwrap_err()
                .code(),
            S3ErrorCode::AccessDenied
        );
    }
}
