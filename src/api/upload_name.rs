//! The name an uploaded file's multipart part gives it: `filename*` (RFC 7578 §4.2 allows
//! it, RFC 8187 says how it is written: `UTF-8''%E6%97%A5.txt`) before `filename` (RFC
//! 6266 §4.3). The multipart crate reads only `filename` (and none at all when `filename*`
//! comes first), so this finds that one parameter in the part's `Content-Disposition` and
//! percent-decodes it; everything else about the part is the crate's.

use axum::http::{HeaderMap, header};
use percent_encoding::percent_decode_str;

/// The name `headers` (a part's) give the file: its `filename*` when it can be read, else
/// `plain` (the crate's `filename`), without the client's directories (a browser or a
/// client on Windows sends `C:\Users\x\data.csv`: `\` separates them there, not on the
/// host, where a file a program writes may have one in its name). `Ok(None)` when neither
/// is given; `Err` saying what is wrong with a `filename*` that cannot be read when no
/// `filename` stands in for it.
pub fn part_filename(headers: &HeaderMap, plain: Option<&str>) -> Result<Option<String>, String> {
    let last_component = |name: String| match name.rsplit_once(['/', '\\']) {
        Some((_, base)) => base.to_owned(),
        None => name,
    };
    given_filename(headers, plain).map(|name| name.map(last_component))
}

fn given_filename(headers: &HeaderMap, plain: Option<&str>) -> Result<Option<String>, String> {
    let extended = headers
        .get(header::CONTENT_DISPOSITION)
        .and_then(|value| parameter(value.as_bytes(), "filename*"));
    match extended.map(|value| decode(&value).map_err(|why| (value, why))) {
        Some(Ok(name)) => Ok(Some(name)),
        // RFC 6266 §4.3: a filename* not understood leaves the filename.
        Some(Err(_)) if plain.is_some() => Ok(plain.map(str::to_owned)),
        Some(Err((value, why))) => Err(format!(
            "the `file` part's filename* ({value}) cannot be read: {why}; give it as \
             filename*=UTF-8''<the name in UTF-8, percent-encoded> (RFC 8187), or give a \
             filename=\"...\""
        )),
        None => Ok(plain.map(str::to_owned)),
    }
}

/// The value of parameter `name` (matched without regard to case) of a
/// `Content-Disposition` value: its parameters are split at the `;` outside quoted strings.
fn parameter(disposition: &[u8], name: &str) -> Option<String> {
    let mut params = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &byte) in disposition.iter().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b';' if !quoted => {
                params.push(&disposition[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    params.push(&disposition[start..]);
    params.into_iter().skip(1).find_map(|param| {
        let param = String::from_utf8_lossy(param);
        let (key, value) = param.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// An RFC 8187 `ext-value` (`charset'language'percent-encoded`) decoded: UTF-8 and
/// ISO-8859-1, the two charsets it names. Quotes around it, which some clients add, are
/// taken off.
fn decode(value: &str) -> Result<String, String> {
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    let mut parts = value.splitn(3, '\'');
    let (Some(charset), Some(_language), Some(encoded)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err("it is not charset'language'name".into());
    };
    let bytes = percent_decode_str(encoded);
    if charset.eq_ignore_ascii_case("utf-8") {
        bytes
            .decode_utf8()
            .map(|name| name.into_owned())
            .map_err(|_| "its name is not UTF-8 once percent-decoded".into())
    } else if charset.eq_ignore_ascii_case("iso-8859-1") {
        Ok(bytes.map(char::from).collect())
    } else {
        Err(format!(
            "its charset is {charset:?}; snakecage reads UTF-8 and ISO-8859-1"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(disposition: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_DISPOSITION,
            axum::http::HeaderValue::from_bytes(disposition).unwrap(),
        );
        headers
    }

    fn name_of(disposition: &str, plain: Option<&str>) -> Result<Option<String>, String> {
        part_filename(&headers(disposition.as_bytes()), plain)
    }

    #[test]
    fn filename_star_is_read_before_filename() {
        let utf8 = "form-data; name=\"file\"; filename*=UTF-8''%E6%97%A5%E6%9C%AC.txt";
        assert_eq!(name_of(utf8, None), Ok(Some("日本.txt".into())));
        let both =
            "form-data; name=\"file\"; filename=\"a.txt\"; filename*=utf-8'de'Gr%C3%BC%C3%9Fe.csv";
        assert_eq!(name_of(both, Some("a.txt")), Ok(Some("Grüße.csv".into())));
        let latin1 = "form-data; name=\"file\"; FILENAME*=iso-8859-1'en'%A3%20rates.txt";
        assert_eq!(name_of(latin1, None), Ok(Some("£ rates.txt".into())));
        let quoted = "form-data; name=\"file\"; filename*=\"UTF-8''r%C3%A9sum%C3%A9.pdf\"";
        assert_eq!(name_of(quoted, None), Ok(Some("résumé.pdf".into())));
    }

    #[test]
    fn a_clients_directories_are_dropped_whichever_separator_it_uses() {
        assert_eq!(
            name_of("form-data; name=\"file\"", Some("C:\\Users\\é\\d.xlsx")),
            Ok(Some("d.xlsx".into()))
        );
        let star = "form-data; name=\"file\"; filename*=UTF-8''dir%2F%C3%A9t%C3%A9.csv";
        assert_eq!(name_of(star, None), Ok(Some("été.csv".into())));
    }

    #[test]
    fn without_filename_star_the_plain_name_stands() {
        let plain = "form-data; name=\"file\"; filename=\"x; filename*=UTF-8''no.txt\"";
        assert_eq!(
            name_of(plain, Some("x; filename*=UTF-8''no.txt")),
            Ok(Some("x; filename*=UTF-8''no.txt".into()))
        );
        assert_eq!(name_of("form-data; name=\"file\"", None), Ok(None));
        assert_eq!(
            part_filename(&HeaderMap::new(), Some("a.txt")),
            Ok(Some("a.txt".into()))
        );
    }

    #[test]
    fn an_unreadable_filename_star_falls_back_or_says_what_is_wrong() {
        let koi8 = "form-data; name=\"file\"; filename*=KOI8-R''%E4%C1.txt; filename=\"da.txt\"";
        assert_eq!(name_of(koi8, Some("da.txt")), Ok(Some("da.txt".into())));
        let err = name_of(
            "form-data; name=\"file\"; filename*=KOI8-R''%E4%C1.txt",
            None,
        )
        .unwrap_err();
        assert!(err.contains("its charset is \"KOI8-R\""), "{err}");
        assert!(err.contains("filename*=UTF-8''"), "{err}");
        let err = name_of("form-data; name=\"file\"; filename*=UTF-8''%FF.txt", None).unwrap_err();
        assert!(err.contains("not UTF-8 once percent-decoded"), "{err}");
        let err = name_of("form-data; name=\"file\"; filename*=%E6%97%A5.txt", None).unwrap_err();
        assert!(err.contains("not charset'language'name"), "{err}");
    }
}
