//! The escaped and encoded forms a secret may take on its way into a log:
//! quoted in JSON or in Go or HCL syntax, in base64, or percent-encoded in a
//! URL. One level only: base64 of a JSON-escaped secret is not produced.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

/// A base64 run shorter than this is too likely to occur by chance in other
/// base64 text: the fragments of [`base64_forms`] below it are dropped.
const MIN_BASE64_FRAGMENT: usize = 8;

/// The line lengths base64 is commonly wrapped at: 76 (MIME, the `base64`
/// tool) and 64 (PEM, `openssl base64`).
const WRAPS: [usize; 2] = [76, 64];

/// Every other form of `secret`, without the secret itself; may repeat.
pub fn forms(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let text = String::from_utf8_lossy(secret);
    out.push(json_minimal(&text).into_bytes());
    out.push(json_go(&text).into_bytes());
    out.push(json_ascii(&text).into_bytes());
    out.push(go_quote(secret, false).into_bytes());
    out.push(go_quote(secret, true).into_bytes());
    if let Ok(text) = std::str::from_utf8(secret) {
        out.push(hcl_quote(text).into_bytes());
    }
    out.extend(base64_forms(secret).into_iter().map(String::into_bytes));
    out.push(percent(secret, true).into_bytes());
    out.push(percent(secret, false).into_bytes());
    out
}

/// JSON string content (no quotes) as serde_json and JavaScript write it:
/// `"`, `\` and control characters escaped, everything else as it is.
pub fn json_minimal(s: &str) -> String {
    let quoted = serde_json::Value::from(s).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// JSON string content as Go's encoding/json writes it (and so Terraform's
/// `jsonencode` and Kubernetes): also `<`, `>`, `&`, U+2028 and U+2029 as
/// `\u` escapes, and control characters other than `\b \f \n \r \t` as
/// `\u00XX` (Go 1.22 and later; earlier versions wrote `\b` and `\f` as
/// `\u0008` and `\u000c`).
pub fn json_go(s: &str) -> String {
    json_escaped(s, |c| {
        matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') || (c as u32) < 0x20
    })
}

/// JSON string content in ASCII, as Python's `json.dumps` writes it:
/// non-ASCII characters and DEL as `\u` escapes (surrogate pairs above
/// U+FFFF).
pub fn json_ascii(s: &str) -> String {
    json_escaped(s, |c| !c.is_ascii() || c.is_ascii_control())
}

/// JSON string content with the short escapes, and `\u` escapes for the
/// characters `u_escaped` picks.
fn json_escaped(s: &str, u_escaped: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u_escaped(c) => u_escape(&mut out, c),
            c => out.push(c),
        }
    }
    out
}

/// `\uXXXX` (lowercase hex), as a surrogate pair above U+FFFF.
fn u_escape(out: &mut String, c: char) {
    let mut units = [0u16; 2];
    for unit in c.encode_utf16(&mut units) {
        out.push_str(&format!("\\u{unit:04x}"));
    }
}

/// The content of Go's `strconv.Quote` (`%q`), or with `ascii` of
/// `strconv.QuoteToASCII`: `\a \b \f \n \r \t \v \\ \"`, other ASCII
/// controls and invalid UTF-8 bytes as `\xNN`, non-printable characters as
/// `\uXXXX` or `\UXXXXXXXX`. Printability follows Go's `unicode.IsPrint`
/// closely but not exactly (controls, separators other than the space, and
/// the common invisible format characters are non-printable here).
pub fn go_quote(bytes: &[u8], ascii: bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{b}' => out.push_str("\\v"),
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c if go_printable(c) && (c.is_ascii() || !ascii) => out.push(c),
                c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push_str(&format!("\\U{:08x}", c as u32)),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn go_printable(c: char) -> bool {
    if c.is_ascii() {
        return (' '..='~').contains(&c);
    }
    let n = c as u32;
    let format = matches!(
        n,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e
            | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x206f | 0xfeff
            | 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0xf0000..
    );
    !c.is_control() && !c.is_whitespace() && !format
}

/// The content of an HCL quoted string (how Terraform and OpenTofu show a
/// value in a diagnostic or a plan): `\n \r \t \" \\`, `${` and `%{`
/// doubled to `$${` and `%%{`, other non-printable characters as `\u`.
pub fn hcl_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '$' | '%' if chars.peek() == Some(&'{') => {
                out.push(c);
                out.push(c);
            }
            c if go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out
}

/// Base64 in the standard and the URL-safe alphabets, with and without
/// padding; the 76- and 64-character lines it is wrapped into; and, for a
/// secret embedded in a longer encoded text (a `user:password` pair, a
/// whole file), the characters that depend on the secret alone at each of
/// the three byte alignments. Those fragments leave up to three characters
/// at each end unredacted: they carry at most 4 bits of the secret each.
/// Fragments shorter than [`MIN_BASE64_FRAGMENT`] are left out.
pub fn base64_forms(secret: &[u8]) -> Vec<String> {
    let mut out = vec![
        STANDARD.encode(secret),
        STANDARD_NO_PAD.encode(secret),
        URL_SAFE.encode(secret),
        URL_SAFE_NO_PAD.encode(secret),
    ];
    let std = &out[0];
    let mut wrapped = Vec::new();
    for width in WRAPS {
        if std.len() > width {
            wrapped.extend(
                std.as_bytes()
                    .chunks(width)
                    .filter(|line| line.len() >= MIN_BASE64_FRAGMENT)
                    .map(|line| String::from_utf8_lossy(line).into_owned()),
            );
        }
    }
    out.extend(wrapped);
    for shift in 0..3usize {
        let mut shifted = vec![0u8; shift];
        shifted.extend_from_slice(secret);
        // Character i covers bits [6i, 6i + 6); the secret's are
        // [8 shift, 8 (shift + len)).
        let first = (8 * shift).div_ceil(6);
        let end = 8 * (shift + secret.len()) / 6;
        if end < first + MIN_BASE64_FRAGMENT {
            continue;
        }
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let encoded = engine.encode(&shifted);
            out.push(encoded[first..end].to_string());
        }
    }
    out
}

/// Percent-encoding of every byte outside the unreserved set
/// `A-Z a-z 0-9 - _ . ~`, uppercase hex; a space as `+` (Go's
/// `url.QueryEscape`, HTML forms) or as `%20` (RFC 3986, Terraform's
/// `urlencode`, JavaScript's `encodeURIComponent` but for `!'()*`).
pub fn percent(bytes: &[u8], space_as_plus: bool) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char);
            }
            b' ' if space_as_plus => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every expected value below is what the named tool printed for the
    // input (Go 1.26 encoding/json, strconv, net/url; Python 3 json,
    // urllib.parse.quote(safe="")).
    const MIXED: &str = "p\"a\\s\ts\nw<o>r&d é\u{1}\u{7f}\u{2028} ☃ 😀";

    #[test]
    fn json_forms() {
        for (input, minimal, go, ascii) in [
            (
                MIXED,
                "p\\\"a\\\\s\\ts\\nw<o>r&d é\\u0001\u{7f}\u{2028} ☃ 😀",
                r#"p\"a\\s\ts\nw\u003co\u003er\u0026d é\u0001\u2028 ☃ 😀"#,
                r#"p\"a\\s\ts\nw<o>r&d \u00e9\u0001\u007f\u2028 \u2603 \ud83d\ude00"#,
            ),
            ("plain-token", "plain-token", "plain-token", "plain-token"),
            (
                "\u{8}\u{c}\u{0}",
                r"\b\f\u0000",
                r"\b\f\u0000",
                r"\b\f\u0000",
            ),
        ] {
            assert_eq!(json_minimal(input), minimal, "{input:?}");
            // Go leaves DEL as it is.
            assert_eq!(json_go(input).replace('\u{7f}', ""), go, "{input:?}");
            assert_eq!(json_ascii(input), ascii, "{input:?}");
        }
    }

    #[test]
    fn go_quoted_forms() {
        for (input, quote, to_ascii) in [
            (
                MIXED.as_bytes(),
                r#"p\"a\\s\ts\nw<o>r&d é\x01\x7f\u2028 ☃ 😀"#,
                r#"p\"a\\s\ts\nw<o>r&d \u00e9\x01\x7f\u2028 \u2603 \U0001f600"#,
            ),
            (b"\xff\xfeok", r"\xff\xfeok", r"\xff\xfeok"),
            (
                "\u{8}\u{c}\u{b}\u{7}\u{0}\u{ad}\u{200b}\u{feff}".as_bytes(),
                r"\b\f\v\a\x00\u00ad\u200b\ufeff",
                r"\b\f\v\a\x00\u00ad\u200b\ufeff",
            ),
        ] {
            assert_eq!(go_quote(input, false), quote, "{input:?}");
            assert_eq!(go_quote(input, true), to_ascii, "{input:?}");
        }
    }

    #[test]
    fn hcl_quoted_forms() {
        assert_eq!(
            hcl_quote("a\"b\\c\nd${e}%{f}$g\u{1}"),
            r#"a\"b\\c\nd$${e}%%{f}$g\u0001"#
        );
    }

    #[test]
    fn percent_forms() {
        for (input, query, rfc3986) in [
            (
                MIXED.as_bytes(),
                "p%22a%5Cs%09s%0Aw%3Co%3Er%26d+%C3%A9%01%7F%E2%80%A8+%E2%98%83+%F0%9F%98%80",
                "p%22a%5Cs%09s%0Aw%3Co%3Er%26d%20%C3%A9%01%7F%E2%80%A8%20%E2%98%83%20%F0%9F%98%80",
            ),
            (
                b"a b/c+d=e?f&g%h~i_j-k.l",
                "a+b%2Fc%2Bd%3De%3Ff%26g%25h~i_j-k.l",
                "a%20b%2Fc%2Bd%3De%3Ff%26g%25h~i_j-k.l",
            ),
            (b"\xff\xfeok", "%FF%FEok", "%FF%FEok"),
        ] {
            assert_eq!(percent(input, true), query, "{input:?}");
            assert_eq!(percent(input, false), rfc3986, "{input:?}");
        }
    }

    #[test]
    fn base64_whole_and_wrapped() {
        let forms = base64_forms(MIXED.as_bytes());
        let std = "cCJhXHMJcwp3PG8+ciZkIMOpAX/igKgg4piDIPCfmIA=";
        assert_eq!(forms[0], std);
        assert_eq!(forms[1], std.trim_end_matches('='));
        assert_eq!(forms[2], std.replace('+', "-").replace('/', "_"));
        assert_eq!(forms[3], forms[2].trim_end_matches('='));
        let long = vec![b'x'; 100];
        let encoded = STANDARD.encode(&long);
        let forms = base64_forms(&long);
        for line in [
            &encoded[..76],
            &encoded[76..],
            &encoded[..64],
            &encoded[64..128],
        ] {
            assert!(forms.iter().any(|f| f == line), "{line}");
        }
    }

    #[test]
    fn base64_inside_a_longer_encoding() {
        let secret = b"hunter2-password";
        let forms = base64_forms(secret);
        for prefix in [&b""[..], b"u", b"us", b"user:", b"Authorization: x"] {
            for suffix in [&b""[..], b"!", b"\n", b"-tail"] {
                let whole = [prefix, &secret[..], suffix].concat();
                for engine in [&STANDARD, &URL_SAFE] {
                    let encoded = engine.encode(&whole);
                    let found = forms
                        .iter()
                        .filter(|f| encoded.contains(f.as_str()))
                        .map(String::len)
                        .max()
                        .unwrap_or(0);
                    // At most 3 characters at each end are left.
                    let own = (secret.len() * 8) / 6;
                    assert!(found + 6 >= own, "{prefix:?} {suffix:?}: {found} of {own}");
                }
            }
        }
        // Too short to have a fragment.
        assert!(base64_forms(b"abcd").iter().all(|f| f.len() >= 6));
    }

    #[test]
    fn every_form_of_a_plain_secret() {
        let forms = forms(b"s3cr3t value/+");
        for want in [
            "s3cr3t value/+",
            "s3cr3t+value%2F%2B",
            "s3cr3t%20value%2F%2B",
            "czNjcjN0IHZhbHVlLys=",
            "czNjcjN0IHZhbHVlLys",
        ] {
            assert!(forms.iter().any(|f| f == want.as_bytes()), "{want}");
        }
    }
}
