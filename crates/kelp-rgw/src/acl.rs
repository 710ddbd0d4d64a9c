//! Canned ACLs: the only kind of access control list the gateway stores (one per bucket, one
//! per object). A canned ACL names a fixed set of grants (AWS's "canned ACL" table); the owner
//! of a bucket always holds FULL_CONTROL of it and of every object in it (objects written by
//! others through a `public-read-write` grant belong to the bucket owner too, as with S3's
//! "bucket owner enforced" ownership).
//!
//! Decisions follow S3: a bucket's grants govern listing (READ) and creating, overwriting and
//! deleting objects (WRITE); an object's own grants govern reading it (READ). A bucket's READ
//! grant does not make its objects readable. Explicit grant lists (`AccessControlPolicy`
//! bodies with arbitrary grantees, `x-amz-grant-*` headers) are not stored: a policy whose
//! grants are exactly those of a canned ACL is accepted as that ACL, anything else is refused.

use serde::{Deserialize, Serialize};

pub const ALL_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
pub const AUTHENTICATED_USERS_URI: &str =
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";

/// A canned ACL, as stored in a bucket record or an object's meta.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CannedAcl {
    /// The owner only.
    #[default]
    Private,
    /// Everyone (anonymous included) may read.
    PublicRead,
    /// Everyone may read and write (write matters on buckets only).
    PublicReadWrite,
    /// Every user of this cluster who signs the request may read.
    AuthenticatedRead,
}

/// Why an `x-amz-acl` value is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("'{0}' is not a canned ACL")]
    Unknown(String),
    #[error("canned ACL '{0}' is not supported")]
    Unsupported(String),
    #[error("canned ACL '{0}' applies to objects, not buckets")]
    ObjectOnly(String),
}

/// What a request wants to do with a bucket or object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Bucket: list; object: read.
    Read,
    /// Bucket: create, overwrite or delete objects in it.
    Write,
}

/// Who signed the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requester {
    Anonymous,
    User(String),
}

impl Requester {
    pub fn is(&self, uid: &str) -> bool {
        matches!(self, Requester::User(u) if u == uid)
    }
}

/// The grantee of one grant of a canned ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Grantee {
    Owner,
    AllUsers,
    AuthenticatedUsers,
}

/// The permission of one grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    FullControl,
    Read,
    Write,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::FullControl => "FULL_CONTROL",
            Permission::Read => "READ",
            Permission::Write => "WRITE",
        }
    }
}

impl CannedAcl {
    /// Parses an `x-amz-acl` value given for a bucket.
    pub fn for_bucket(s: &str) -> Result<CannedAcl, AclError> {
        match s {
            "bucket-owner-read" | "bucket-owner-full-control" => {
                Err(AclError::ObjectOnly(s.to_string()))
            }
            _ => CannedAcl::for_object(s),
        }
    }

    /// Parses an `x-amz-acl` value given for an object. `bucket-owner-read` and
    /// `bucket-owner-full-control` give the bucket owner rights it holds anyway (every object
    /// belongs to its bucket's owner), so they are `private`.
    pub fn for_object(s: &str) -> Result<CannedAcl, AclError> {
        match s {
            "private" | "bucket-owner-read" | "bucket-owner-full-control" => Ok(CannedAcl::Private),
            "public-read" => Ok(CannedAcl::PublicRead),
            "public-read-write" => Ok(CannedAcl::PublicReadWrite),
            "authenticated-read" => Ok(CannedAcl::AuthenticatedRead),
            "aws-exec-read" | "log-delivery-write" => Err(AclError::Unsupported(s.to_string())),
            _ => Err(AclError::Unknown(s.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CannedAcl::Private => "private",
            CannedAcl::PublicRead => "public-read",
            CannedAcl::PublicReadWrite => "public-read-write",
            CannedAcl::AuthenticatedRead => "authenticated-read",
        }
    }

    pub fn is_private(&self) -> bool {
        *self == CannedAcl::Private
    }

    /// Whether `who` may do `what` on a bucket or object with this ACL, owned by `owner`.
    pub fn allows(self, owner: &str, who: &Requester, what: Access) -> bool {
        if who.is(owner) {
            return true;
        }
        match (self, what) {
            (CannedAcl::PublicRead, Access::Read) => true,
            (CannedAcl::PublicReadWrite, _) => true,
            (CannedAcl::AuthenticatedRead, Access::Read) => matches!(who, Requester::User(_)),
            _ => false,
        }
    }

    /// The grants this ACL stands for, as GetBucketAcl / GetObjectAcl list them.
    pub fn grants(self) -> Vec<(Grantee, Permission)> {
        let mut g = vec![(Grantee::Owner, Permission::FullControl)];
        match self {
            CannedAcl::Private => {}
            CannedAcl::PublicRead => g.push((Grantee::AllUsers, Permission::Read)),
            CannedAcl::PublicReadWrite => {
                g.push((Grantee::AllUsers, Permission::Read));
                g.push((Grantee::AllUsers, Permission::Write));
            }
            CannedAcl::AuthenticatedRead => g.push((Grantee::AuthenticatedUsers, Permission::Read)),
        }
        g
    }

    /// The canned ACL whose grants are exactly `grants` (order and duplicates aside), if any.
    pub fn from_grants(grants: &[(Grantee, Permission)]) -> Option<CannedAcl> {
        let mut want: Vec<_> = grants.to_vec();
        want.sort();
        want.dedup();
        [
            CannedAcl::Private,
            CannedAcl::PublicRead,
            CannedAcl::PublicReadWrite,
            CannedAcl::AuthenticatedRead,
        ]
        .into_iter()
        .find(|acl| {
            let mut have = acl.grants();
            have.sort();
            have == want
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(u: &str) -> Requester {
        Requester::User(u.into())
    }

    #[test]
    fn parse() {
        assert_eq!(
            CannedAcl::for_object("public-read"),
            Ok(CannedAcl::PublicRead)
        );
        assert_eq!(
            CannedAcl::for_object("bucket-owner-full-control"),
            Ok(CannedAcl::Private)
        );
        assert!(matches!(
            CannedAcl::for_bucket("bucket-owner-read"),
            Err(AclError::ObjectOnly(_))
        ));
        assert!(matches!(
            CannedAcl::for_bucket("aws-exec-read"),
            Err(AclError::Unsupported(_))
        ));
        assert!(matches!(
            CannedAcl::for_bucket("everyone"),
            Err(AclError::Unknown(_))
        ));
        for acl in [
            CannedAcl::Private,
            CannedAcl::PublicRead,
            CannedAcl::PublicReadWrite,
            CannedAcl::AuthenticatedRead,
        ] {
            assert_eq!(CannedAcl::for_bucket(acl.as_str()), Ok(acl));
            assert_eq!(CannedAcl::from_grants(&acl.grants()), Some(acl));
        }
    }

    #[test]
    fn decisions() {
        use Access::*;
        let anon = Requester::Anonymous;
        for acl in [
            CannedAcl::Private,
            CannedAcl::PublicRead,
            CannedAcl::PublicReadWrite,
            CannedAcl::AuthenticatedRead,
        ] {
            assert!(acl.allows("o", &user("o"), Write), "{acl:?}");
        }
        assert!(!CannedAcl::Private.allows("o", &user("x"), Read));
        assert!(!CannedAcl::Private.allows("o", &anon, Read));
        assert!(CannedAcl::PublicRead.allows("o", &anon, Read));
        assert!(!CannedAcl::PublicRead.allows("o", &anon, Write));
        assert!(CannedAcl::PublicReadWrite.allows("o", &anon, Write));
        assert!(CannedAcl::AuthenticatedRead.allows("o", &user("x"), Read));
        assert!(!CannedAcl::AuthenticatedRead.allows("o", &anon, Read));
        assert!(!CannedAcl::AuthenticatedRead.allows("o", &user("x"), Write));
    }

    #[test]
    fn grants_match_aws() {
        assert_eq!(
            CannedAcl::PublicReadWrite.grants(),
            vec![
                (Grantee::Owner, Permission::FullControl),
                (Grantee::AllUsers, Permission::Read),
                (Grantee::AllUsers, Permission::Write),
            ]
        );
        // a policy granting something no canned ACL grants is not one of them
        assert_eq!(
            CannedAcl::from_grants(&[
                (Grantee::Owner, Permission::FullControl),
                (Grantee::AuthenticatedUsers, Permission::Write),
            ]),
            None
        );
        // nor is one that leaves the owner out
        assert_eq!(
            CannedAcl::from_grants(&[(Grantee::AllUsers, Permission::Read)]),
            None
        );
    }

    #[test]
    fn stored_form() {
        assert_eq!(
            serde_json::to_string(&CannedAcl::PublicReadWrite).unwrap(),
            "\"public-read-write\""
        );
    }
}
