//! The dashboard's HTTP server: static pages (embedded in the binary), the JSON API under
//! `/api/`, login and the admin actions.
//!
//! Rules: nothing but `/login` and the static assets answers without credentials (`/api/`
//! answers 401, pages redirect to the login page); admin actions answer 403 to a read-only
//! user; every list is paginated (`?page=&per_page=`). A standby manager answers a plain GET
//! with a redirect (307) to the active manager's dashboard, anything else (a POSTed login, an
//! action, a URL with a key) with 503 and a link to it, and everything with 503 while no
//! active manager is known. `/login` takes credentials by POST only (a GET with a key is
//! refused: keys do not belong in URLs).
//! Requests only read the last poll's [`View`], so a page never waits for the cluster.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, COOKIE, HeaderValue, LOCATION, SET_COOKIE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kelp_proto::{MonCommand, MonReply, OsdScrubCommand};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::auth::{self, Role};
use crate::daemon::{Shared, warn_action};
use crate::view::{View, paginate, progress_json};

const INDEX_HTML: &str = include_str!("assets/index.html");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// The dashboard's pages (one HTML shell; `app.js` draws the page the path names).
pub const PAGES: &[&str] = &[
    "/",
    "/health",
    "/osds",
    "/pools",
    "/pgs",
    "/io",
    "/buckets",
    "/progress",
    "/log",
];

type Resp = Response<Full<Bytes>>;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn respond(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn json_resp(status: StatusCode, v: &Value) -> Resp {
    respond(status, "application/json", v.to_string())
}

fn error(status: StatusCode, message: &str) -> Resp {
    json_resp(status, &json!({"error": message}))
}

fn redirect(status: StatusCode, to: &str) -> Resp {
    let mut r = respond(status, "text/plain", format!("see {to}\n"));
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(LOCATION, v);
    }
    r
}

fn header(req: &Request<Incoming>, name: hyper::header::HeaderName) -> Option<&str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn query_param(query: &[(String, String)], key: &str) -> Option<String> {
    query.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

fn page_params(query: &[(String, String)]) -> (usize, usize) {
    let num = |k: &str, d: usize| {
        query_param(query, k)
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    (num("page", 1), num("per_page", 50))
}

/// Only local paths are followed after a login.
fn safe_next(next: Option<String>) -> String {
    // A path on this site only: not `//host` nor `/\host` (browsers read both as another
    // site), and no control characters.
    next.filter(|n| {
        n.starts_with('/')
            && !n.starts_with("//")
            && !n.contains('\\')
            && !n.chars().any(char::is_control)
    })
    .unwrap_or_else(|| "/".to_string())
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let query = auth::form_pairs(req.uri().query().unwrap_or(""));
    if !shared.is_active() {
        // Only plain GETs (no key in the URL) are sent on; anything else (a POSTed login
        // with its key, an admin action) gets a 503 with a link to the active manager: a
        // request's body or credentials are never forwarded to an address from the map.
        let forwardable = req.method() == Method::GET && query_param(&query, "key").is_none();
        return match shared.active_url() {
            Some(url) if !forwardable => standby_refusal(&url, &path),
            Some(url) => {
                let target = format!(
                    "{}{}{}",
                    url.trim_end_matches('/'),
                    path,
                    req.uri()
                        .query()
                        .map(|q| format!("?{q}"))
                        .unwrap_or_default()
                );
                redirect(StatusCode::TEMPORARY_REDIRECT, &target)
            }
            None => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "this manager is a standby and no active manager is known",
            ),
        };
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/static/app.js") => {
            return respond(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS);
        }
        (&Method::GET, "/static/style.css") => {
            return respond(StatusCode::OK, "text/css; charset=utf-8", STYLE_CSS);
        }
        (&Method::GET, "/login") if query_param(&query, "key").is_some() => {
            // a key in a URL ends up in histories, logs and Referer headers
            let mut r = error(
                StatusCode::METHOD_NOT_ALLOWED,
                "log in with POST /login (the form), never with the key in the URL",
            );
            r.headers_mut()
                .insert(hyper::header::ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        (&Method::GET, "/login") => {
            return respond(StatusCode::OK, "text/html; charset=utf-8", LOGIN_HTML);
        }
        (&Method::POST, "/login") => {
            let body = match Limited::new(req.into_body(), 16 << 10).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return error(StatusCode::PAYLOAD_TOO_LARGE, "form too large"),
            };
            let form = auth::form_pairs(&String::from_utf8_lossy(&body));
            return login(shared, &form).await;
        }
        (&Method::GET, "/logout") => {
            let mut r = redirect(StatusCode::SEE_OTHER, "/login");
            r.headers_mut().insert(
                SET_COOKIE,
                HeaderValue::from_static(
                    "kelp_dashboard=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax",
                ),
            );
            return r;
        }
        _ => {}
    }
    let who = match auth::credentials(header(&req, COOKIE), header(&req, AUTHORIZATION)) {
        Some((name, key)) => shared
            .authenticate(&name, &key)
            .await
            .map(|role| (name, role)),
        None => None,
    };
    let is_api = path.starts_with("/api/");
    let Some((user, role)) = who else {
        if is_api {
            return error(StatusCode::UNAUTHORIZED, "log in first (a dashboard key)");
        }
        if req.method() == Method::GET && PAGES.contains(&path.as_str()) {
            return redirect(
                StatusCode::SEE_OTHER,
                &format!("/login?next={}", auth::encode_component(&path)),
            );
        }
        return error(StatusCode::NOT_FOUND, "no such page");
    };
    if !is_api {
        if req.method() == Method::GET && PAGES.contains(&path.as_str()) {
            return respond(StatusCode::OK, "text/html; charset=utf-8", INDEX_HTML);
        }
        return error(StatusCode::NOT_FOUND, "no such page");
    }
    if req.method() == Method::POST {
        if role != Role::Admin {
            return error(
                StatusCode::FORBIDDEN,
                &format!("{user} is read-only: this action needs the admin role"),
            );
        }
        return action(shared, &path).await;
    }
    if req.method() != Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED, "GET or POST");
    }
    if path == "/api/whoami" {
        return json_resp(
            StatusCode::OK,
            &json!({"user": user, "role": role.name(), "mgr": shared.name}),
        );
    }
    if path == "/api/log" {
        let (page, per_page) = page_params(&query);
        let entries = match shared.mon(MonCommand::LogLast { n: 100_000 }).await {
            Some(MonReply::ClusterLog(e)) => e,
            _ => return error(StatusCode::BAD_GATEWAY, "the monitors did not answer"),
        };
        let items: Vec<Value> = entries
            .iter()
            .rev()
            .map(|e| {
                json!({"seq": e.seq, "stamp_ms": e.stamp_ms, "level": e.level.short(),
                    "who": e.who, "message": e.message})
            })
            .collect();
        return json_resp(StatusCode::OK, &paginate(items, page, per_page));
    }
    let Some(view) = shared.view() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the manager has not looked at the cluster yet; try again in a few seconds",
        );
    };
    api(shared, &view, &path, &query)
}

fn api(shared: &Shared, view: &View, path: &str, query: &[(String, String)]) -> Resp {
    let (page, per_page) = page_params(query);
    let list = |items: Vec<Value>| json_resp(StatusCode::OK, &paginate(items, page, per_page));
    match path {
        "/api/summary" => {
            let last = shared
                .series
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last(1);
            let progress = shared
                .progress
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            json_resp(StatusCode::OK, &view.summary(last.first(), &progress))
        }
        "/api/health" => json_resp(StatusCode::OK, &view.health_json()),
        "/api/osds" => list(view.osds()),
        "/api/pools" => list(view.pools()),
        "/api/pgs" => list(view.pgs(query_param(query, "state").as_deref())),
        "/api/pg_states" => list(view.pg_states()),
        "/api/buckets" => list(view.buckets_json()),
        "/api/s3_pools" => list(view.s3_pools()),
        "/api/progress" => list(
            shared
                .progress
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(progress_json)
                .collect(),
        ),
        "/api/io" => {
            let samples = shared
                .series
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last(usize::MAX);
            let items = samples
                .iter()
                .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
                .collect();
            // a chart wants the whole series: one page of it by default
            let per_page = if query_param(query, "per_page").is_some() {
                per_page
            } else {
                900
            };
            json_resp(StatusCode::OK, &paginate(items, page, per_page))
        }
        "/api/mgr" => json_resp(
            StatusCode::OK,
            &serde_json::to_value(&view.mgrmap).unwrap_or(Value::Null),
        ),
        _ => error(StatusCode::NOT_FOUND, "no such API"),
    }
}

/// A standby's answer to what it does not forward: 503, with the active manager's dashboard
/// named (`active` in JSON for the API, a link on a page).
fn standby_refusal(active: &str, path: &str) -> Resp {
    let message = "this manager is a standby: use the active manager's dashboard";
    if path.starts_with("/api/") {
        return json_resp(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": message, "active": active}),
        );
    }
    let link = html_escape(active);
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/html; charset=utf-8",
        format!(
            "<!doctype html><title>Standby manager</title><p>{message}: \
             <a id=\"active\" href=\"{link}\">{link}</a></p>\n"
        ),
    )
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn login(shared: &Shared, form: &[(String, String)]) -> Resp {
    let user = query_param(form, "user").unwrap_or_default();
    let key = query_param(form, "key").unwrap_or_default();
    let next = safe_next(query_param(form, "next"));
    if shared.authenticate(&user, &key).await.is_none() {
        return redirect(
            StatusCode::SEE_OTHER,
            &format!("/login?failed=1&next={}", auth::encode_component(&next)),
        );
    }
    let mut r = redirect(StatusCode::SEE_OTHER, &next);
    let cookie = format!(
        "{}={}; Path=/; HttpOnly; SameSite=Lax",
        auth::COOKIE,
        auth::encode_component(&format!("{user}:{key}"))
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(SET_COOKIE, v);
    }
    r
}

/// Admin actions: `POST /api/osd/ID/out`, `/api/osd/ID/in`, `/api/osd/ID/deep-scrub`,
/// `/api/pg/PGID/deep-scrub`.
async fn action(shared: &Shared, path: &str) -> Resp {
    let parts: Vec<&str> = path.trim_start_matches("/api/").split('/').collect();
    match parts.as_slice() {
        ["osd", id, verb] => {
            let Ok(id) = id.parse::<i32>() else {
                return error(StatusCode::BAD_REQUEST, "bad OSD id");
            };
            let cmd = match *verb {
                "out" => MonCommand::OsdOut { id },
                "in" => MonCommand::OsdIn { id },
                "deep-scrub" => {
                    return match shared
                        .rados
                        .osd_scrub_command(
                            id,
                            OsdScrubCommand::Scrub { deep: true },
                            std::time::Duration::from_secs(5),
                        )
                        .await
                    {
                        Ok(r) => {
                            json_resp(StatusCode::OK, &json!({"done": true, "pgs": r.pgs.len()}))
                        }
                        Err(e) => {
                            warn_action("osd deep-scrub", &e);
                            error(StatusCode::BAD_GATEWAY, &e.to_string())
                        }
                    };
                }
                _ => return error(StatusCode::NOT_FOUND, "no such action"),
            };
            match shared.mon(cmd).await {
                Some(MonReply::Done { epoch }) => {
                    json_resp(StatusCode::OK, &json!({"done": true, "epoch": epoch}))
                }
                Some(MonReply::Error { message }) => error(StatusCode::CONFLICT, &message),
                other => error(
                    StatusCode::BAD_GATEWAY,
                    &format!("the monitors answered {other:?}"),
                ),
            }
        }
        ["pg", pgid, "deep-scrub"] => {
            let Ok(pg) = pgid.parse::<kelp_types::PgId>() else {
                return error(StatusCode::BAD_REQUEST, "bad PG id");
            };
            match shared
                .rados
                .pg_command(pg, kelp_proto::PgCommandKind::Scrub { deep: true })
                .await
            {
                Ok(_) => json_resp(StatusCode::OK, &json!({"done": true})),
                Err(e) => {
                    warn_action("pg deep-scrub", &e);
                    error(StatusCode::BAD_GATEWAY, &e.to_string())
                }
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such action"),
    }
}

#[cfg(test)]
mod redirect_tests {
    #[test]
    fn a_standby_names_the_active_manager_without_forwarding() {
        let r = super::standby_refusal("http://127.0.0.1:1/", "/login");
        assert_eq!(r.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get(hyper::header::LOCATION).is_none());
        let r = super::standby_refusal("http://a/\"<x>", "/api/osd/1/out");
        assert_eq!(r.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get(hyper::header::LOCATION).is_none());
        assert_eq!(super::html_escape("\"<&>"), "&quot;&lt;&amp;&gt;");
    }

    use super::safe_next;

    #[test]
    fn login_redirects_stay_on_this_site() {
        assert_eq!(safe_next(Some("/osds?page=2".into())), "/osds?page=2");
        for bad in [
            "//evil.example/",
            "/\\evil.example/",
            "https://evil.example/",
            "osds",
            "/a\r\nSet-Cookie: x",
        ] {
            assert_eq!(safe_next(Some(bad.into())), "/", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/");
    }
}
