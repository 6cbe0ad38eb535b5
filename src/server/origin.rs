//! Who may send requests: the server answers programs, not web pages that happen to be open
//! in a browser on the same machine.
//!
//! A page on any site can make the browser POST to `http://127.0.0.1:8080/` (a "simple"
//! request, `text/plain`, needs no permission), and a name the page's site controls can be
//! made to resolve to 127.0.0.1 (DNS rebinding). So:
//! * the `Host` a request names must be an IP address, `localhost`, or a name the server was
//!   told to answer to (`serve --allow-host NAME`): a rebound name is refused;
//! * an `Origin` (sent by browsers, never by `curl`, Python or an OpenAI client) must name
//!   such a host too: a page of another site is refused;
//! * the JSON routes take `Content-Type: application/json` (or none): the `text/plain` and
//!   form bodies a page can send without asking are refused.
//!
//! Each refusal is a 403 or 415 with `{"error": ...}` that says what to send instead.

use super::api::ApiError;
use axum::http::{header, HeaderMap};

/// The hosts a server answers to beside IP addresses and `localhost`.
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// IP addresses, `localhost` and `names` (lower case, no port).
    pub fn new(names: &[String]) -> Self {
        AllowedHosts {
            names: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether `host` (a `Host` header's host, without its port) is one of them.
    fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<std::net::IpAddr>().is_ok()
            || host == "localhost"
            || self.names.contains(&host)
    }

    /// Refuses a request whose `Host` or `Origin` names another host, or a JSON route's body
    /// of another content type.
    pub fn check(&self, headers: &HeaderMap, json_route: bool) -> Result<(), ApiError> {
        let forbidden = |message: String| ApiError {
            status: 403,
            message,
        };
        if let Some(host) = headers.get(header::HOST) {
            let host = host.to_str().unwrap_or("");
            if !self.allows(host_of(host)) {
                return Err(forbidden(format!(
                    "this server does not answer to the host {host:?}: use its address, or \
                     start it with --allow-host {}",
                    host_of(host)
                )));
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            let host = origin.split_once("://").map(|(_, rest)| host_of(rest));
            if !host.is_some_and(|h| self.allows(h)) {
                return Err(forbidden(format!(
                    "requests from web pages of another site ({origin}) are refused; call the \
                     server from a program, or start it with --allow-host for that site"
                )));
            }
        }
        if json_route {
            if let Some(kind) = headers.get(header::CONTENT_TYPE) {
                let kind = kind.to_str().unwrap_or("");
                let essence = kind.split(';').next().unwrap_or("").trim();
                if !essence.eq_ignore_ascii_case("application/json") {
                    return Err(ApiError {
                        status: 415,
                        message: format!(
                            "the body is JSON: send Content-Type: application/json, not {kind:?} \
                             (curl: --json '{{...}}', or -H 'Content-Type: application/json')"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The host of `authority` (`host[:port]`, `[v6]:port`, an origin's rest).
fn host_of(authority: &str) -> &str {
    let authority = authority.split('/').next().unwrap_or("");
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    authority.split(':').next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn hosts_origins_and_content_types() {
        let allowed = AllowedHosts::new(&["ngram.example".into()]);
        let status = |pairs: &[(header::HeaderName, &str)], json: bool| {
            allowed.check(&headers(pairs), json).err().map(|e| e.status)
        };
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:80",
            "10.0.0.7",
            "NGRAM.example:443",
        ] {
            assert_eq!(status(&[(header::HOST, ok)], true), None, "{ok}");
        }
        for bad in ["evil.example:8080", "x", "localhost.evil.example", ""] {
            assert_eq!(status(&[(header::HOST, bad)], true), Some(403), "{bad}");
        }
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost",
            "https://ngram.example",
        ] {
            assert_eq!(status(&[(header::ORIGIN, ok)], true), None, "{ok}");
        }
        for bad in [
            "https://evil.example",
            "null",
            "http://localhost.evil.example",
        ] {
            assert_eq!(status(&[(header::ORIGIN, bad)], true), Some(403), "{bad}");
        }
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
        ] {
            assert_eq!(status(&[(header::CONTENT_TYPE, ok)], true), None, "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert_eq!(
                status(&[(header::CONTENT_TYPE, bad)], true),
                Some(415),
                "{bad}"
            );
            assert_eq!(status(&[(header::CONTENT_TYPE, bad)], false), None, "{bad}");
        }
        assert_eq!(status(&[], true), None);
    }
}
