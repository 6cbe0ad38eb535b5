//! Who may send requests: the server answers programs, not web pages that happen to be open
//! in a browser on the same machine.
//!
//! A page on any site can make the browser POST to `http://127.0.0.1:8080/` (a "simple"
//! request, `text/plain`, needs no permission), and a name the page's site controls can be
//! made to resolve to 127.0.0.1 (DNS rebinding). So:
//! * the `Host` a request names (one header, a port of digits) must be an IP address,
//!   `localhost`, or a name the server was told to answer to (`serve --allow-host NAME`): a
//!   rebound name is refused;
//! * an `Origin` (sent by browsers, never by `curl`, Python or an OpenAI client) must be a
//!   page of this machine (a loopback address, `localhost`), of an allowed name, or of the
//!   server itself (the request's own host and port): a page of another site is refused,
//!   one served from a bare IP address included;
//! * the JSON routes take `Content-Type: application/json` (or none): the `text/plain` and
//!   form bodies a page can send without asking are refused.
//!
//! Each of these headers is read once: a request that sends two is refused.
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
        self.names_or_ip(host, |_| true)
    }

    /// Whether a page of `origin_host` may call: one of this machine's (a loopback address,
    /// `localhost`) or of an allowed name. Any other address is another machine's site.
    fn allows_page(&self, origin_host: &str) -> bool {
        self.names_or_ip(origin_host, std::net::IpAddr::is_loopback)
    }

    /// Whether `host` is `localhost`, an allowed name, or an IP address that `ip` takes.
    fn names_or_ip(&self, host: &str, ip: impl Fn(&std::net::IpAddr) -> bool) -> bool {
        let host = host.to_ascii_lowercase();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<std::net::IpAddr>().is_ok_and(|a| ip(&a))
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
        let host = one(headers, header::HOST)?;
        if let Some(host) = host {
            if !port_is_digits(host) || !self.allows(host_of(host)) {
                return Err(forbidden(format!(
                    "this server does not answer to the host {host:?}: use its address, or \
                     start it with --allow-host {}",
                    host_of(host)
                )));
            }
        }
        if let Some(origin) = one(headers, header::ORIGIN)? {
            let authority = origin.split_once("://").map(|(_, rest)| rest);
            let same_server = authority.is_some_and(|a| host.is_some_and(|h| h == a));
            let page_host = authority.filter(|a| port_is_digits(a)).map(host_of);
            if !same_server && !page_host.is_some_and(|h| self.allows_page(h)) {
                return Err(forbidden(format!(
                    "requests from web pages of another site ({origin}) are refused; call the \
                     server from a program, or start it with --allow-host for that site"
                )));
            }
        }
        if json_route {
            if let Some(kind) = one(headers, header::CONTENT_TYPE)? {
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

/// The one value of header `name`, if sent: two are refused (a check reading the first would
/// pass a second it never saw), and so is one that is not visible ASCII.
fn one(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(&name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad(format!(
            "the request has more than one {name} header; send one"
        )));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::bad(format!("the {name} header is not ASCII text")))
}

/// Whether `authority`'s port, if it has one, is digits (`localhost:evil.example` has none).
fn port_is_digits(authority: &str) -> bool {
    let authority = authority.split('/').next().unwrap_or("");
    let after_host = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((_, after)) => after,
            None => return false,
        },
        None => authority.find(':').map_or("", |i| &authority[i..]),
    };
    match after_host.strip_prefix(':') {
        None => after_host.is_empty(),
        Some(port) => !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()),
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
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// A page served from a bare IP address is another machine's site; the server's own
    /// address (host and port) and this machine's loopback pages are not. Two Host, Origin
    /// or Content-Type headers are refused, and so is a Host whose port is not a number.
    #[test]
    fn pages_of_other_addresses_and_doubled_headers() {
        let allowed = AllowedHosts::new(&[]);
        let status = |pairs: &[(header::HeaderName, &str)]| {
            allowed.check(&headers(pairs), true).err().map(|e| e.status)
        };
        let local = (header::HOST, "127.0.0.1:8080");
        for bad in [
            "http://203.0.113.5",
            "http://10.0.0.7:8080",
            "http://[2001:db8::1]",
            "http://127.0.0.1:evil.example",
        ] {
            assert_eq!(
                status(&[local.clone(), (header::ORIGIN, bad)]),
                Some(403),
                "{bad}"
            );
        }
        for ok in [
            "http://127.0.0.1:3000",
            "http://[::1]:8080",
            "http://127.0.0.2",
        ] {
            assert_eq!(status(&[local.clone(), (header::ORIGIN, ok)]), None, "{ok}");
        }
        // The server's own page, by the address it was asked at.
        let lan = (header::HOST, "10.0.0.7:8080");
        assert_eq!(
            status(&[lan.clone(), (header::ORIGIN, "http://10.0.0.7:8080")]),
            None
        );
        assert_eq!(
            status(&[lan, (header::ORIGIN, "http://10.0.0.7:9090")]),
            Some(403)
        );
        for bad in [
            "localhost:evil.example",
            "127.0.0.1:",
            "[::1]x",
            "localhost:80:80",
        ] {
            assert_eq!(status(&[(header::HOST, bad)]), Some(403), "{bad}");
        }
        for (name, a, b) in [
            (header::HOST, "localhost", "evil.example"),
            (header::ORIGIN, "http://localhost", "https://evil.example"),
            (header::CONTENT_TYPE, "application/json", "text/plain"),
        ] {
            assert_eq!(
                status(&[(name.clone(), a), (name, b)]),
                Some(400),
                "{a} {b}"
            );
        }
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
