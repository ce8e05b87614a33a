//! Which bytes of a stored file a download sends: the one byte range its `Range` asks for
//! (RFC 9110 §14), read against the file's size, when its `If-Range` (if any) names the
//! file's bytes; otherwise all of them.

use std::ops::Range;

use axum::http::{HeaderMap, HeaderValue, Method, header};
use http_range_header::{ParsedRanges, RangeUnsatisfiableError, parse_range_header};

use crate::error::ApiError;

/// A download's strong validator (`ETag`). A stored file never changes (an upload, or a
/// file a run writes, is stored under a new id), so its id names its bytes for good.
pub fn etag(file_id: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{file_id}\"")).expect("a file id is a header value")
}

/// The byte range a request asks for, before the file's size is known; `None` when it is
/// to get the whole file. RFC 9110 §14.2 lets a server ignore `Range`, and it is ignored:
/// on any method but GET (HEAD included: ranges are defined for GET alone), when it does
/// not parse, and when it asks for more than one range (a `multipart/byteranges` answer
/// is no use to a client resuming or slicing a download, which asks for one).
pub fn requested(method: &Method, headers: &HeaderMap) -> Option<ParsedRanges> {
    if method != Method::GET {
        return None;
    }
    let mut values = headers.get_all(header::RANGE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let ranges = parse_range_header(value.to_str().ok()?).ok()?;
    (ranges.len() == 1).then_some(ranges)
}

/// The bytes to send of a file of `size` bytes whose validator is `etag`: `None` for all of
/// them, else the range asked for (cut at the file's end). All of them when `If-Range`
/// does not name this file's bytes: the client's partial copy is of other bytes, and a
/// date never matches (downloads send no `Last-Modified`). 416 for a range that selects
/// no byte of the file.
pub fn select(
    requested: &ParsedRanges,
    headers: &HeaderMap,
    etag: &HeaderValue,
    size: u64,
) -> Result<Option<Range<u64>>, ApiError> {
    // A strong comparison (RFC 9110 §13.1.5): a weak tag never matches.
    if headers
        .get(header::IF_RANGE)
        .is_some_and(|validator| validator != etag)
    {
        return Ok(None);
    }
    match requested.validate(size) {
        Ok(ranges) => Ok(match ranges.as_slice() {
            [range] => Some(*range.start()..range.end() + 1),
            // Only a suffix range of an empty file: all of it is nothing.
            _ => None,
        }),
        Err(RangeUnsatisfiableError::Unsatisfiable) => Err(ApiError::RangeNotSatisfiable { size }),
        Err(_) => Ok(None),
    }
}

/// `Content-Range` of a part sent.
pub fn content_range(range: &Range<u64>, size: u64) -> HeaderValue {
    let last = range.end - 1;
    HeaderValue::from_str(&format!("bytes {}-{last}/{size}", range.start))
        .expect("numbers are a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0190c0de-0000-7000-8000-000000000000";

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    /// What a GET with these headers gets of a 1000-byte file.
    fn part(pairs: &[(header::HeaderName, &str)]) -> Result<Option<Range<u64>>, u64> {
        let headers = headers(pairs);
        let Some(asked) = requested(&Method::GET, &headers) else {
            return Ok(None);
        };
        select(&asked, &headers, &etag(ID), 1000).map_err(|e| match e {
            ApiError::RangeNotSatisfiable { size } => size,
            other => panic!("{other}"),
        })
    }

    #[test]
    fn one_range_of_each_form_is_cut_at_the_end_of_the_file() {
        let range = |value: &str| part(&[(header::RANGE, value)]);
        assert_eq!(range("bytes=0-0"), Ok(Some(0..1)));
        assert_eq!(range("bytes=100-199"), Ok(Some(100..200)));
        assert_eq!(range("bytes=900-5000"), Ok(Some(900..1000)));
        assert_eq!(range("bytes=990-"), Ok(Some(990..1000)));
        assert_eq!(range("bytes=-10"), Ok(Some(990..1000)));
        assert_eq!(range("bytes=-5000"), Ok(Some(0..1000)));
        assert_eq!(range("bytes=1000-"), Err(1000));
        assert_eq!(range("bytes=1000-2000"), Err(1000));
        assert_eq!(range("bytes=-0"), Err(1000));
    }

    #[test]
    fn several_ranges_and_what_does_not_parse_get_the_whole_file() {
        for value in [
            "bytes=0-9,20-29",
            "bytes=0-9, 2000-",
            "bytes=9-0",
            "bytes=abc",
            "items=0-9",
            "bytes=",
            "",
        ] {
            assert_eq!(part(&[(header::RANGE, value)]), Ok(None), "{value}");
        }
        let two_headers = [(header::RANGE, "bytes=0-9"), (header::RANGE, "bytes=5-9")];
        assert_eq!(part(&two_headers), Ok(None));
    }

    #[test]
    fn if_range_holds_only_for_the_files_own_strong_tag() {
        let with =
            |validator: &str| part(&[(header::RANGE, "bytes=5-9"), (header::IF_RANGE, validator)]);
        assert_eq!(with(&format!("\"{ID}\"")), Ok(Some(5..10)));
        assert_eq!(with(&format!("W/\"{ID}\"")), Ok(None));
        assert_eq!(with(ID), Ok(None));
        assert_eq!(with("\"0190c0de-0000-7000-8000-000000000001\""), Ok(None));
        assert_eq!(with("Wed, 21 Oct 2026 07:28:00 GMT"), Ok(None));
        // A range past the end with another file's tag: the whole file, not 416.
        let stale = [
            (header::RANGE, "bytes=5000-"),
            (header::IF_RANGE, "\"other\""),
        ];
        assert_eq!(part(&stale), Ok(None));
    }

    #[test]
    fn only_a_get_is_ranged() {
        let headers = headers(&[(header::RANGE, "bytes=0-9")]);
        assert!(requested(&Method::GET, &headers).is_some());
        assert!(requested(&Method::HEAD, &headers).is_none());
        assert!(requested(&Method::DELETE, &headers).is_none());
    }

    #[test]
    fn an_empty_file_has_no_range_but_a_suffix_of_it_is_the_whole() {
        let headers = headers(&[(header::RANGE, "bytes=-5")]);
        let asked = requested(&Method::GET, &headers).unwrap();
        assert!(matches!(select(&asked, &headers, &etag(ID), 0), Ok(None)));
        let headers = self::headers(&[(header::RANGE, "bytes=0-")]);
        let asked = requested(&Method::GET, &headers).unwrap();
        assert!(matches!(
            select(&asked, &headers, &etag(ID), 0),
            Err(ApiError::RangeNotSatisfiable { size: 0 })
        ));
    }

    #[test]
    fn content_range_names_the_last_byte_and_the_size() {
        assert_eq!(content_range(&(0..1), 1000), "bytes 0-0/1000");
        assert_eq!(content_range(&(990..1000), 1000), "bytes 990-999/1000");
    }
}
