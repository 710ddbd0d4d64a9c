//! Put/Get/DeleteBucketCors: the rules live in the bucket record; `server.rs` applies them to
//! preflight (`OPTIONS`) and actual requests.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use super::{KelpS3, s3_err};
use crate::cors::{CorsError, CorsRule, validate};

fn cors_err(e: CorsError) -> S3Error {
    let code = match e {
        CorsError::NoRules | CorsError::EmptyRule => S3ErrorCode::MalformedXML,
        _ => S3ErrorCode::InvalidRequest,
    };
    S3Error::with_message(code, e.to_string())
}

fn from_dto(r: CORSRule) -> CorsRule {
    CorsRule {
        id: r.id,
        allowed_origins: r.allowed_origins,
        allowed_methods: r.allowed_methods,
        allowed_headers: r.allowed_headers.unwrap_or_default(),
        expose_headers: r.expose_headers.unwrap_or_default(),
        max_age_seconds: r.max_age_seconds,
    }
}

fn to_dto(r: &CorsRule) -> CORSRule {
    let opt = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    CORSRule {
        id: r.id.clone(),
        allowed_origins: r.allowed_origins.clone(),
        allowed_methods: r.allowed_methods.clone(),
        allowed_headers: opt(&r.allowed_headers),
        expose_headers: opt(&r.expose_headers),
        max_age_seconds: r.max_age_seconds,
    }
}

impl KelpS3 {
    pub(super) async fn do_put_bucket_cors(
        &self,
        req: S3Request<PutBucketCorsInput>,
    ) -> S3Result<S3Response<PutBucketCorsOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let rules: Vec<CorsRule> = req
            .input
            .cors_configuration
            .cors_rules
            .into_iter()
            .map(from_dto)
            .collect();
        validate(&rules).map_err(cors_err)?;
        self.rgw
            .update_bucket(&b, |r| r.cors = rules.clone())
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(PutBucketCorsOutput::default()))
    }

    pub(super) async fn do_get_bucket_cors(
        &self,
        req: S3Request<GetBucketCorsInput>,
    ) -> S3Result<S3Response<GetBucketCorsOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        if b.cors.is_empty() {
            return Err(s3_error!(
                NoSuchCORSConfiguration,
                "The CORS configuration does not exist"
            ));
        }
        Ok(S3Response::new(GetBucketCorsOutput {
            cors_rules: Some(b.cors.iter().map(to_dto).collect()),
        }))
    }

    pub(super) async fn do_delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        self.rgw
            .update_bucket(&b, |r| r.cors.clear())
            .await
            .map_err(s3_err)?;
        let mut resp = S3Response::new(DeleteBucketCorsOutput::default());
        resp.status = Some(hyper::StatusCode::NO_CONTENT);
        Ok(resp)
    }
}
