//! What a stored file is called: its name (the last component of the one it was uploaded
//! with, at most [`MAX_NAME_BYTES`], cut from the end of its stem so its extension stays),
//! its MIME type (from that extension), and its id as a client may give it (a UUID in
//! either case).

/// The MIME type for a file name, from its extension.
pub fn mime_for(filename: &str) -> String {
    mime_guess::from_path(filename)
        .first_raw()
        .unwrap_or("application/octet-stream")
        .to_owned()
}

/// The most bytes a stored file's name may have (a file system's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// The longest extension a name cut to [`MAX_NAME_BYTES`] keeps, in bytes with its dot.
const MAX_EXTENSION_BYTES: usize = 32;

/// A name safe to store and to put in a header: the last path component (after the last
/// `/`: an upload's client path was cut where its own separators are, and a `\` is part
/// of a name a program gives its file on this host), control characters dropped, at most [`MAX_NAME_BYTES`]
/// bytes: a longer name loses the end of its stem, never its extension (the type the
/// listing reports comes from it) and never half a character.
pub fn clean_filename(raw: &str) -> String {
    clean_filename_within(raw, str::len)
}

/// [`clean_filename`], the name's bytes counted by `bytes` as a store writes them (the S3
/// store percent-encodes them in an object key). `bytes` must add up over the parts of a
/// name, as a per-byte encoding does.
pub fn clean_filename_within(raw: &str, bytes: impl Fn(&str) -> usize) -> String {
    let base = raw.rsplit('/').next().unwrap_or_default();
    let name: String = base.chars().filter(|c| !c.is_control()).collect();
    let name = shorten(name, MAX_NAME_BYTES, bytes);
    match name.trim() {
        "" | "." | ".." => "file".to_owned(),
        _ => name,
    }
}

/// `name` in at most `max` bytes (as `bytes` counts them): cut at the end of its stem, so
/// that a final `.ext` (of at most [`MAX_EXTENSION_BYTES`]) stays, between characters.
fn shorten(name: String, max: usize, bytes: impl Fn(&str) -> usize) -> String {
    if bytes(&name) <= max {
        return name;
    }
    let extension = match name.rfind('.') {
        Some(dot) if dot > 0 && bytes(&name[dot..]) <= MAX_EXTENSION_BYTES.min(max) => &name[dot..],
        _ => "",
    };
    let stem = &name[..name.len() - extension.len()];
    let mut left = max - bytes(extension);
    let mut end = 0;
    let mut buf = [0u8; 4];
    for c in stem.chars() {
        let size = bytes(c.encode_utf8(&mut buf));
        if size > left {
            break;
        }
        left -= size;
        end += c.len_utf8();
    }
    format!("{}{extension}", &stem[..end])
}

/// The id a file is stored under (a UUID, hyphenated, lower-case) for an id as a client
/// gives it: UUIDs are compared without regard to case, so `0192…-ABCD` names the same file
/// as `0192…-abcd`. `None` for anything else (another form of UUID, a path), which names
/// no file.
pub fn canonical_file_id(id: &str) -> Option<String> {
    if id.len() != 36 {
        return None;
    }
    let uuid = uuid::Uuid::try_parse(id).ok()?;
    Some(uuid.hyphenated().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_are_reduced_to_a_safe_last_component() {
        assert_eq!(clean_filename("data.csv"), "data.csv");
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("back\\slash.txt"), "back\\slash.txt");
        assert_eq!(clean_filename("a\nb\r.txt"), "ab.txt");
        assert_eq!(clean_filename(".."), "file");
        assert_eq!(clean_filename(""), "file");
        assert_eq!(clean_filename(&"é".repeat(200)).len(), 254);
    }

    #[test]
    fn a_long_name_loses_the_end_of_its_stem_and_keeps_its_extension() {
        let long = format!("{}.csv", "x".repeat(300));
        let cut = clean_filename(&long);
        assert_eq!(cut, format!("{}.csv", "x".repeat(251)));
        assert_eq!(mime_for(&cut), "text/csv");
        // Bytes, not characters, and never half of one: é is two bytes, 日 three.
        let cut = clean_filename(&format!("{}.csv", "é".repeat(200)));
        assert_eq!(cut, format!("{}.csv", "é".repeat(125)));
        let cut = clean_filename(&format!("{}.tsv", "日".repeat(100)));
        assert_eq!(cut, format!("{}.tsv", "日".repeat(83)));
        assert!(cut.len() <= MAX_NAME_BYTES);
        let cut = clean_filename(&format!("{}.données", "ü".repeat(200)));
        assert!(
            cut.ends_with(".données") && cut.len() <= MAX_NAME_BYTES,
            "{cut}"
        );
        // No extension, or one too long to be one: cut at the end.
        assert_eq!(clean_filename(&"y".repeat(300)), "y".repeat(255));
        let odd = format!("a.{}", "z".repeat(300));
        assert_eq!(clean_filename(&odd), odd[..255]);
        let hidden = format!(".{}", "h".repeat(300));
        assert_eq!(clean_filename(&hidden), hidden[..255]);
        // A name within the limit is left alone.
        let exact = format!("{}.csv", "x".repeat(251));
        assert_eq!(clean_filename(&exact), exact);
    }

    #[test]
    fn file_ids_are_uuids_of_any_case() {
        let id = "0192f1a8-7c3e-7abc-8def-0123456789ab";
        assert_eq!(canonical_file_id(id).as_deref(), Some(id));
        assert_eq!(canonical_file_id(&id.to_uppercase()).as_deref(), Some(id));
        assert_eq!(canonical_file_id("0192f1a87c3e7abc8def0123456789ab"), None);
        assert_eq!(canonical_file_id(&format!("{{{id}}}")), None);
        assert_eq!(canonical_file_id("garbage"), None);
        assert_eq!(canonical_file_id("../../etc/passwd"), None);
    }

    #[test]
    fn mime_types_come_from_the_extension() {
        assert_eq!(mime_for("plot.png"), "image/png");
        assert_eq!(mime_for("data.csv"), "text/csv");
        assert_eq!(mime_for("noext"), "application/octet-stream");
    }
}
