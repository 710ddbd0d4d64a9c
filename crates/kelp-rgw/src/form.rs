//! Browser POST uploads (`multipart/form-data`): `s3s` verifies the form's SigV4 signature
//! and its policy, then hands the gateway a PutObject-like input; two things of the form do
//! not survive that: the `acl` field (S3's name for it in a form; `s3s` only reads
//! `x-amz-acl`) and the name of the uploaded file, which `${filename}` in the `key` field
//! stands for. [`FormSniffer`] wraps the request body on its way into `s3s` and records the
//! form fields and the file's name as they stream past (everything before the file part,
//! at most [`MAX_FIELDS_BYTES`]); the POST handler reads them from the request extensions
//! ([`PostForm`]). The body itself passes through untouched.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

/// How much of a form (fields and part headers, before the file) is examined.
pub const MAX_FIELDS_BYTES: usize = 1 << 20;

/// What the sniffer saw of a form.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FormFields {
    /// Fields before the file, names lowercased, in form order.
    pub fields: Vec<(String, String)>,
    /// The file part's `filename` (as sent; see [`FormFields::file_name`]).
    pub filename: Option<String>,
    /// The file part was reached: `fields` is complete.
    pub complete: bool,
    /// The fields were larger than [`MAX_FIELDS_BYTES`] or not a well-formed form.
    pub invalid: bool,
}

impl FormFields {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The object key a form's `key` field names: `${filename}` stands for the file's name.
    pub fn resolve_key(&self, key: &str) -> String {
        if key.contains("${filename}") {
            key.replace("${filename}", self.file_name().unwrap_or_default())
        } else {
            key.to_string()
        }
    }

    /// The uploaded file's name without any directory a browser may have put in front.
    pub fn file_name(&self) -> Option<&str> {
        self.filename
            .as_deref()
            .map(|f| f.rsplit(['/', '\\']).next().unwrap_or(f))
    }
}

/// The fields of the form in flight, shared by the sniffer and the POST handler (a request
/// extension).
#[derive(Debug, Clone, Default)]
pub struct PostForm(pub Arc<Mutex<FormFields>>);

impl PostForm {
    pub fn snapshot(&self) -> FormFields {
        self.0.lock().map(|f| f.clone()).unwrap_or_default()
    }
}

/// The boundary of a `multipart/form-data` content type, if it is one.
pub fn form_boundary(content_type: &str) -> Option<String> {
    let mut parts = content_type.split(';');
    let mime = parts.next()?.trim();
    if !mime.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    parts.find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// A body that records the form fields passing through it into a [`PostForm`].
pub struct FormSniffer<B> {
    inner: B,
    boundary: Vec<u8>,
    buf: Vec<u8>,
    done: bool,
    out: PostForm,
}

impl<B> FormSniffer<B> {
    pub fn new(inner: B, boundary: &str, out: PostForm) -> FormSniffer<B> {
        FormSniffer {
            inner,
            boundary: boundary.as_bytes().to_vec(),
            buf: Vec::new(),
            done: false,
            out,
        }
    }

    fn feed(&mut self, data: &[u8]) {
        if self.done {
            return;
        }
        self.buf.extend_from_slice(data);
        let parsed = parse_fields(&self.buf, &self.boundary);
        let finished = match parsed {
            Parsed::NeedMore if self.buf.len() > MAX_FIELDS_BYTES => Some(FormFields {
                invalid: true,
                ..FormFields::default()
            }),
            Parsed::NeedMore => None,
            Parsed::Invalid => Some(FormFields {
                invalid: true,
                ..FormFields::default()
            }),
            Parsed::Done(f) => Some(f),
        };
        if let Some(f) = finished {
            self.done = true;
            self.buf = Vec::new();
            if let Ok(mut out) = self.out.0.lock() {
                *out = f;
            }
        }
    }
}

impl<B> Body for FormSniffer<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if !this.done
            && let Poll::Ready(Some(Ok(frame))) = &r
            && let Some(data) = frame.data_ref()
        {
            let data = data.clone();
            this.feed(&data);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    NeedMore,
    Invalid,
    Done(FormFields),
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() || needle.is_empty() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Parses the fields of a form up to its file part (or its end).
fn parse_fields(buf: &[u8], boundary: &[u8]) -> Parsed {
    let mut delim = b"--".to_vec();
    delim.extend_from_slice(boundary);
    let mut next_delim = b"\r\n".to_vec();
    next_delim.extend_from_slice(&delim);
    let mut out = FormFields::default();
    let Some(mut pos) = find(buf, &delim, 0) else {
        return Parsed::NeedMore;
    };
    loop {
        pos += delim.len();
        if buf.len() < pos + 2 {
            return Parsed::NeedMore;
        }
        if &buf[pos..pos + 2] == b"--" {
            // the end of a form without a file
            out.complete = true;
            return Parsed::Done(out);
        }
        if &buf[pos..pos + 2] != b"\r\n" {
            return Parsed::Invalid;
        }
        pos += 2;
        let Some(headers_end) = find(buf, b"\r\n\r\n", pos) else {
            return Parsed::NeedMore;
        };
        let Ok(headers) = std::str::from_utf8(&buf[pos..headers_end]) else {
            return Parsed::Invalid;
        };
        let Some((name, filename)) = headers
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
            .and_then(|(_, v)| content_disposition(v))
        else {
            return Parsed::Invalid;
        };
        let body = headers_end + 4;
        if name.eq_ignore_ascii_case("file") {
            out.filename = filename;
            out.complete = true;
            return Parsed::Done(out);
        }
        let Some(end) = find(buf, &next_delim, body) else {
            return Parsed::NeedMore;
        };
        out.fields.push((
            name.to_ascii_lowercase(),
            String::from_utf8_lossy(&buf[body..end]).into_owned(),
        ));
        pos = end + 2;
    }
}

/// `name` and `filename` of a `form-data; name="…"; filename="…"` header value.
fn content_disposition(v: &str) -> Option<(String, Option<String>)> {
    let mut params = Vec::new();
    let mut chars = v.chars().peekable();
    // the disposition type
    for c in chars.by_ref() {
        if c == ';' {
            break;
        }
    }
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ';') {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ';' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                value.push(n);
                            }
                        }
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ';' {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
            }
        }
        params.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    Some((get("name")?, get("filename")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORM: &str = "--XyZ\r\n\
        Content-Disposition: form-data; name=\"key\"\r\n\r\n\
        uploads/${filename}\r\n\
        --XyZ\r\n\
        Content-Disposition: form-data; name=\"ACL\"\r\n\r\n\
        public-read\r\n\
        --XyZ\r\n\
        Content-Disposition: form-data; name=\"x-amz-meta-note\"\r\n\r\n\
        two\r\nlines\r\n\
        --XyZ\r\n\
        Content-Disposition: form-data; name=\"file\"; filename=\"C:\\\\docs\\\\a; b.txt\"\r\n\
        Content-Type: text/plain\r\n\r\n\
        the file\r\n\
        --XyZ--\r\n";

    #[test]
    fn fields_before_the_file() {
        let Parsed::Done(f) = parse_fields(FORM.as_bytes(), b"XyZ") else {
            panic!("not parsed");
        };
        assert_eq!(f.field("key"), Some("uploads/${filename}"));
        assert_eq!(f.field("acl"), Some("public-read"));
        assert_eq!(f.field("x-amz-meta-note"), Some("two\r\nlines"));
        assert_eq!(f.filename.as_deref(), Some("C:\\docs\\a; b.txt"));
        assert_eq!(f.file_name(), Some("a; b.txt"));
        assert_eq!(f.resolve_key("uploads/${filename}"), "uploads/a; b.txt");
        assert_eq!(f.resolve_key("fixed"), "fixed");
        assert!(f.complete && !f.invalid);
    }

    #[test]
    fn any_chunking_gives_the_same_fields() {
        let whole = match parse_fields(FORM.as_bytes(), b"XyZ") {
            Parsed::Done(f) => f,
            other => panic!("{other:?}"),
        };
        for cut in 1..FORM.len() {
            let out = PostForm::default();
            let mut s = FormSniffer::new((), "XyZ", out.clone());
            s.feed(&FORM.as_bytes()[..cut]);
            s.feed(&FORM.as_bytes()[cut..]);
            assert_eq!(out.snapshot(), whole, "cut at {cut}");
        }
        // a prefix that ends inside the fields is not complete
        assert_eq!(
            parse_fields(&FORM.as_bytes()[..40], b"XyZ"),
            Parsed::NeedMore
        );
    }

    #[test]
    fn malformed_and_boundaries() {
        assert_eq!(
            parse_fields(b"--XyZ\r\nno-disposition: x\r\n\r\nv\r\n--XyZ--", b"XyZ"),
            Parsed::Invalid
        );
        assert_eq!(
            form_boundary("multipart/form-data; boundary=\"abc\""),
            Some("abc".into())
        );
        assert_eq!(
            form_boundary("Multipart/Form-Data;charset=utf-8; boundary=q1"),
            Some("q1".into())
        );
        assert_eq!(form_boundary("application/xml"), None);
    }
}
