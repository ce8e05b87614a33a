//! `POST/GET /v1/files`, `GET/DELETE /v1/files/{id}`, wire-compatible with the Onyx code
//! interpreter. Uploads stream to the store (never held whole in memory) and are cut off
//! with 413 as soon as they pass the maximum size.

use std::io;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::io::{ReaderStream, StreamReader};

use super::SharedState;
use super::byte_range;
use super::upload_name::part_filename;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::files::{FileMeta, StoreError, canonical_file_id};

/// The multipart field that carries the file.
const FILE_FIELD: &str = "file";

pub async fn upload(
    State(state): State<SharedState>,
    caller: Caller,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let mut multipart = multipart.map_err(|rejection| {
        let sent = headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::trim);
        ApiError::UnsupportedMediaType(match sent {
            Some(t) if t.eq_ignore_ascii_case("multipart/form-data") => format!(
                "the multipart/form-data body has no usable boundary in its Content-Type \
                 (`multipart/form-data; boundary=...`): {}",
                rejection.body_text()
            ),
            Some(t) => format!(
                "expected a multipart/form-data body with a `{FILE_FIELD}` field (curl -F \
                 {FILE_FIELD}=@data.csv), not a {t} body"
            ),
            None => format!(
                "expected a multipart/form-data body with a `{FILE_FIELD}` field (curl -F \
                 {FILE_FIELD}=@data.csv); the request has no Content-Type"
            ),
        })
    })?;
    // One file per upload (the answer names one file_id). The first `file` part streams
    // to the store, which sees the end of it only once the whole body has been read: a
    // second `file` part (or a body cut off) fails it before it is committed, so the file
    // is never listed, never counted against a quota, and nothing is left to delete.
    let (named, name) = oneshot::channel();
    let (chunks, received) = mpsc::channel(1);
    let reading = read_parts(&mut multipart, named, chunks);
    let storing = async {
        // No name: no `file` part (or one refused before its bytes), nothing to store.
        let filename = name
            .await
            .map_err(|_| StoreError::Source(io::Error::other("no file part")))?;
        let received = futures_util::stream::unfold(received, |mut received| async {
            received.recv().await.map(|chunk| (chunk, received))
        });
        let mut body = StreamReader::new(Box::pin(received));
        state
            .store
            .put(caller.file_owner(), &filename, &mut body)
            .await
    };
    let (read, stored) = tokio::join!(reading, storing);
    // The store's refusal (too large, quota, no space) first: the rest of the body was read
    // all the same, so the client receives it instead of a reset while it writes. What
    // the file part held in all then tells a file larger than a whole quota from one that
    // would fit once others are deleted.
    let stored = match (stored, &read) {
        (Err(e), Ok((_, file_bytes))) if !matches!(e, StoreError::Source(_)) => {
            return Err(e.with_whole_size(*file_bytes).into());
        }
        (Err(e), _) if !matches!(e, StoreError::Source(_)) => return Err(e.into()),
        (stored, _) => stored,
    };
    match read?.0 {
        0 => {
            return Err(ApiError::Validation(format!(
                "the multipart body has no `{FILE_FIELD}` field: send the file as `{FILE_FIELD}`"
            )));
        }
        1 => {}
        n => {
            return Err(ApiError::BadRequest(format!(
                "the multipart body has {n} `{FILE_FIELD}` parts, and an upload stores one \
                 file (its answer names one file_id): send each file in a request of its \
                 own; none of these was stored"
            )));
        }
    }
    let meta = stored?;
    tracing::info!(file_id = %meta.file_id, size = meta.size_bytes, "file uploaded");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "file_id": meta.file_id,
            "filename": meta.filename,
            "size_bytes": meta.size_bytes,
        })),
    ))
}

/// Reads a multipart upload to its end and says how many `file` parts it has, and how
/// many bytes the first one held. The first one's name goes to `named`, then its bytes to
/// `chunks`, which ends cleanly (the file is whole) only if the body ends well formed with
/// no other `file` part; otherwise it ends with an error, so the store keeps nothing.
/// Other fields are skipped. Once the store has stopped taking the file (it refused it),
/// the rest is read and dropped (and counted).
async fn read_parts(
    multipart: &mut Multipart,
    named: oneshot::Sender<String>,
    chunks: mpsc::Sender<io::Result<Bytes>>,
) -> Result<(usize, u64), ApiError> {
    let spoil = |why: &str| io::Error::other(format!("the upload was refused: {why}"));
    let mut named = Some(named);
    let mut file_parts = 0usize;
    let mut file_bytes = 0u64;
    loop {
        let mut field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => return Ok((file_parts, file_bytes)),
            Err(e) => {
                let _ = chunks.send(Err(spoil("malformed multipart body"))).await;
                return Err(bad_multipart(e));
            }
        };
        if field.name() != Some(FILE_FIELD) {
            continue; // other fields are skipped (and drained) by the next next_field
        }
        file_parts += 1;
        if file_parts == 2 {
            let _ = chunks.send(Err(spoil("a second `file` part"))).await;
        }
        let Some(named) = named.take() else {
            continue; // not stored: drained by the next next_field
        };
        let filename = part_filename(field.headers(), field.file_name())
            .map_err(ApiError::BadRequest)?
            .unwrap_or_else(|| "file".to_owned());
        let _ = named.send(filename);
        loop {
            match field.chunk().await {
                // A send that fails: the store gave up on the file; read on regardless.
                Ok(Some(chunk)) => {
                    file_bytes += chunk.len() as u64;
                    drop(chunks.send(Ok(chunk)).await);
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = chunks.send(Err(spoil("malformed multipart body"))).await;
                    return Err(bad_multipart(e));
                }
            }
        }
    }
}

fn bad_multipart(e: axum::extract::multipart::MultipartError) -> ApiError {
    ApiError::BadRequest(format!("malformed multipart body: {}", e.body_text()))
}

/// One entry of `GET /v1/files`.
#[derive(Debug, Serialize)]
pub struct FileEntry {
    pub file_id: String,
    pub filename: String,
    pub size_bytes: u64,
    pub upload_time: String,
    pub mime_type: String,
}

impl From<FileMeta> for FileEntry {
    fn from(meta: FileMeta) -> Self {
        Self {
            upload_time: meta.upload_time(),
            file_id: meta.file_id,
            filename: meta.filename,
            size_bytes: meta.size_bytes,
            mime_type: meta.mime_type,
        }
    }
}

/// The most files one page of `GET /v1/files?limit=` may hold.
pub const MAX_PAGE: usize = 10_000;

/// `GET /v1/files` pages: `limit` files per page, those whose id sorts after `after`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
}

/// Every file of the caller, ordered by id; with `limit` (and `after`, the last id of the
/// page before), one page of them and the `next_after` that fetches the next one (`null`
/// on the last page). Without either, the whole list, as the Onyx API returns it.
pub async fn list(
    State(state): State<SharedState>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; limit is a whole number from 1 to {MAX_PAGE}, after a file_id",
            e.body_text()
        ))
    })?;
    if let Some(n) = q.limit.filter(|&n| n == 0 || n > MAX_PAGE) {
        return Err(ApiError::BadRequest(format!(
            "limit must be from 1 to {MAX_PAGE}, not {n}"
        )));
    }
    // A cursor that is no file id would read as an empty last page: a pager would stop.
    // An empty one is the first page (a shell loop's `after=$NEXT` before any page).
    let after = match q.after.as_deref() {
        None | Some("") => None,
        Some(given) => Some(canonical_file_id(given).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "after must be a file_id from a previous page (its next_after), not {given:?}; \
                 leave it out for the first page"
            ))
        })?),
    };
    let mut metas = state.store.list(caller.owner()).await?;
    let usage = usage_of(&state, &caller, &metas);
    metas.sort_unstable_by(|a, b| a.file_id.cmp(&b.file_id));
    if let Some(after) = &after {
        metas.retain(|m| &m.file_id > after);
    }
    let paged = q.limit.is_some() || after.is_some();
    let limit = q.limit.unwrap_or(usize::MAX);
    let more = metas.len() > limit;
    metas.truncate(limit);
    let next_after = more
        .then(|| metas.last().map(|m| m.file_id.clone()))
        .flatten();
    let files: Vec<FileEntry> = metas.into_iter().map(FileEntry::from).collect();
    if paged {
        Ok(Json(
            json!({ "files": files, "next_after": next_after, "usage": usage }),
        ))
    } else {
        Ok(Json(json!({ "files": files, "usage": usage })))
    }
}

/// What the caller's files (all of them, whatever page is asked) count against its bounds:
/// `files`, `charged_bytes` (each file its size in whole blocks of the store plus one
/// block), and the bounds that apply to it (`null`: none). Without keys the store's own.
fn usage_of(state: &SharedState, caller: &Caller, files: &[FileMeta]) -> Value {
    let (charge, bounds) = state.store.charging();
    let charged: u64 = files.iter().map(|m| charge.of(m.size_bytes)).sum();
    let owner = caller.file_owner();
    let (quota, max_files) = match owner.name {
        Some(name) => (
            bounds
                .owner_quota(Some(name), owner.quota_bytes)
                .map(|q| q.bytes),
            bounds.max_files_per_key,
        ),
        None => (bounds.quota_bytes, bounds.max_files),
    };
    json!({
        "files": files.len(),
        "charged_bytes": charged,
        "quota_bytes": quota,
        "max_files": max_files,
        "block_bytes": charge.block,
    })
}

/// The file's bytes: all of them (200), or the one range a GET's `Range` asks for (206,
/// see [`byte_range`]). Every answer says `Accept-Ranges: bytes` and carries the file's
/// `ETag`, so a client can resume a download with `If-Range`.
pub async fn download(
    State(state): State<SharedState>,
    caller: Caller,
    method: Method,
    request_headers: HeaderMap,
    Path(file_id): Path<String>,
) -> Result<Response, ApiError> {
    let owner = caller.owner();
    // A range is resolved against the file's size before its bytes are asked for, so the
    // store reads only the range.
    let range = match byte_range::requested(&method, &request_headers) {
        None => None,
        Some(asked) => {
            let meta = state.store.meta(&file_id, owner).await?;
            let etag = byte_range::etag(&meta.file_id);
            byte_range::select(&asked, &request_headers, &etag, meta.size_bytes)?
        }
    };
    let (meta, reader) = state.store.get(&file_id, owner, range.clone()).await?;
    let mut response = Body::from_stream(ReaderStream::new(reader)).into_response();
    let headers = response.headers_mut();
    // The type the listing reports (from the name's extension). Always an attachment,
    // never sniffed: a stored `.html` or `.svg` is downloaded, not rendered on this origin.
    let mime = HeaderValue::from_str(&meta.mime_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_TYPE, mime);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_DISPOSITION,
        content_disposition(&meta.filename),
    );
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::ETAG, byte_range::etag(&meta.file_id));
    let sent = match &range {
        Some(range) => {
            headers.insert(
                header::CONTENT_RANGE,
                byte_range::content_range(range, meta.size_bytes),
            );
            range.end - range.start
        }
        None => meta.size_bytes,
    };
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(sent));
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    Ok(response)
}

pub async fn delete(
    State(state): State<SharedState>,
    caller: Caller,
    Path(file_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.store.delete(&file_id, caller.owner()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `attachment; filename="…"`, with an RFC 5987 `filename*` when the name is not plain
/// ASCII (the quoted one then has `_` in place of what ASCII cannot say).
fn content_disposition(filename: &str) -> HeaderValue {
    let ascii: String = filename
        .chars()
        .map(|c| match c {
            '"' | '\\' => '_',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '_',
        })
        .collect();
    let mut value = format!("attachment; filename=\"{ascii}\"");
    if ascii != filename {
        value.push_str("; filename*=UTF-8''");
        for byte in filename.bytes() {
            if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
                value.push(byte as char);
            } else {
                value.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_disposition_quotes_ascii_and_encodes_the_rest() {
        assert_eq!(
            content_disposition("plot.png"),
            "attachment; filename=\"plot.png\""
        );
        assert_eq!(
            content_disposition("a\"b.csv"),
            "attachment; filename=\"a_b.csv\"; filename*=UTF-8''a%22b.csv"
        );
        assert_eq!(
            content_disposition("résumé.txt"),
            "attachment; filename=\"r_sum_.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9.txt"
        );
    }
}
