//! Installed distributions read from their `.dist-info` directories, without an
//! interpreter and without trusting the files: the name and version METADATA declares,
//! the top-level names `top_level.txt` declares, the paths `RECORD` lists, and which
//! distribution provides a module as `importlib.metadata` attributes them. The supervisor
//! reads them for package management, the zygote's package scan for the versions
//! `/v1/packages` reports.
//!
//! Anything installed can write these files, so each is read only when it is a regular
//! file (opening a FIFO would block the reader for ever), up to a bound, and only as
//! UTF-8: a file that fails any of that counts as absent, and what it would have said is
//! unknown. Nothing here panics on what it reads.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The most of METADATA read for its header block (the headers come first; the long
/// description after them is never read).
const HEADERS_BOUND: u64 = 1 << 20;
/// The largest `top_level.txt` read.
const TOP_LEVEL_BOUND: u64 = 1 << 20;
/// The largest `RECORD` read: the biggest wheels' (a few MB) fit many times over.
const RECORD_BOUND: u64 = 64 << 20;

/// One `*.dist-info` directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistInfo {
    path: PathBuf,
}

/// What METADATA's header block says: its first `Name` and `Version` headers (matched
/// without regard to case, as email headers are), each trimmed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    pub name: Option<String>,
    pub version: Option<String>,
}

impl DistInfo {
    /// The `*.dist-info` entries directly in `dir`, in the order of their names.
    pub fn all_in(dir: &Path) -> std::io::Result<Vec<DistInfo>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let is_dist_info = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".dist-info"));
            if is_dist_info {
                found.push(DistInfo { path });
            }
        }
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }

    /// The `.dist-info` directory at `path`.
    pub fn at(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// METADATA's `Name` and `Version`; both unknown when it cannot be read, when a line
    /// of its header block is not UTF-8, or when the block does not end within
    /// [`HEADERS_BOUND`].
    pub fn headers(&self) -> Headers {
        let Some(file) = open_regular(&self.path.join("METADATA")) else {
            return Headers::default();
        };
        let mut reader = BufReader::new(file.take(HEADERS_BOUND));
        let mut headers = Headers::default();
        let mut read = 0;
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) if read < HEADERS_BOUND => return headers,
                Ok(0) | Err(_) => return Headers::default(),
                Ok(n) => read += n as u64,
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                return Headers::default();
            };
            let text = text.trim_end_matches(['\r', '\n']);
            if text.is_empty() {
                return headers;
            }
            let Some((key, value)) = text.split_once(':') else {
                continue;
            };
            let slot = if key.eq_ignore_ascii_case("Name") {
                &mut headers.name
            } else if key.eq_ignore_ascii_case("Version") {
                &mut headers.version
            } else {
                continue;
            };
            slot.get_or_insert_with(|| value.trim().to_owned());
        }
    }

    /// The text of `top_level.txt`, when the build wrote one that can be read.
    pub fn top_level_txt(&self) -> Option<String> {
        read_text(&self.path.join("top_level.txt"), TOP_LEVEL_BOUND)
    }

    /// The installed paths `RECORD` lists (the first field of each row), relative to the
    /// directory the `.dist-info` is in; none when it cannot be read.
    pub fn record_paths(&self) -> Vec<String> {
        let Some(record) = read_text(&self.path.join("RECORD"), RECORD_BOUND) else {
            return Vec::new();
        };
        record
            .lines()
            .map(first_csv_field)
            .filter(|path| !path.is_empty())
            .collect()
    }

    /// The top-level names `importlib.metadata.packages_distributions()` attributes to this
    /// distribution: the whitespace-separated words of `top_level.txt` when it has any,
    /// else for each path of `RECORD` its first component, or for a file at the top its
    /// module name (`suffixes`: the interpreter's `importlib.machinery.all_suffixes()`),
    /// names with a dot left out.
    pub fn provides(&self, suffixes: &[String]) -> BTreeSet<String> {
        if let Some(text) = self.top_level_txt() {
            let declared: BTreeSet<String> = text.split_whitespace().map(str::to_owned).collect();
            if !declared.is_empty() {
                return declared;
            }
        }
        self.record_paths()
            .iter()
            .filter_map(|path| inferred_top_level(path, suffixes))
            .collect()
    }
}

/// For each of `names`, the version of the distribution that provides it: the first, in
/// `path` order (the interpreter's `sys.path`; in a directory, by the names of the
/// `.dist-info`), whose [`DistInfo::provides`] holds the name. `None` when none does, or
/// when the one that does declares no version or its METADATA cannot be read.
///
/// `importlib.metadata` gives the same, with two differences where the files contradict
/// each other or are broken: it looks the version up again by the METADATA's `Name`
/// (which finds this same directory unless the name contradicts the directory's), and a
/// METADATA or RECORD it cannot parse makes it raise rather than say "unknown".
pub fn versions_of(path: &[PathBuf], names: &[String], suffixes: &[String]) -> Vec<Option<String>> {
    let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let mut found: HashMap<&str, Option<String>> = HashMap::new();
    'path: for dir in path {
        // An empty entry is the current directory, as for the interpreter.
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let Ok(dists) = DistInfo::all_in(dir) else {
            continue;
        };
        for dist in dists {
            if found.len() == wanted.len() {
                break 'path;
            }
            let provides = dist.provides(suffixes);
            let new: Vec<&str> = wanted
                .iter()
                .copied()
                .filter(|name| !found.contains_key(name) && provides.contains(*name))
                .collect();
            if new.is_empty() {
                continue;
            }
            let version = dist.headers().version;
            for name in new {
                found.insert(name, version.clone());
            }
        }
    }
    names
        .iter()
        .map(|name| found.get(name.as_str()).cloned().flatten())
        .collect()
}

/// The module `importlib.metadata` infers from one RECORD path: the first component of
/// a path below the top (`pkg/sub/mod.py` ⇒ `pkg`, with or without an `__init__.py`:
/// namespace packages count), else the file's module name (`mod.py`,
/// `mod.cpython-312-x86_64-linux-gnu.so` ⇒ `mod`; a file with none of `suffixes` names
/// nothing); a name with a dot (`pkg-1.0.dist-info`, `pkg.libs`, `..`) names nothing.
fn inferred_top_level(path: &str, suffixes: &[String]) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    let name = match parts.as_slice() {
        [] => return None,
        [file] => module_name(file, suffixes)?,
        [first, ..] => first,
    };
    (!name.contains('.')).then(|| name.to_owned())
}

/// `inspect.getmodulename`: the file name without the longest of `suffixes` it ends with.
fn module_name<'a>(file: &'a str, suffixes: &[String]) -> Option<&'a str> {
    suffixes
        .iter()
        .filter(|suffix| file.ends_with(suffix.as_str()))
        .max_by_key(|suffix| suffix.len())
        .map(|suffix| &file[..file.len() - suffix.len()])
}

/// The first field of a CSV row: up to the first comma, or the quoted field (`""` inside
/// it is one quote) when the row starts with a quote.
fn first_csv_field(row: &str) -> String {
    let Some(quoted) = row.strip_prefix('"') else {
        return row.split(',').next().unwrap_or_default().to_owned();
    };
    let mut field = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            field.push(c);
        } else if chars.clone().next() == Some('"') {
            field.push('"');
            chars.next();
        } else {
            break;
        }
    }
    field
}

/// Opens `path` for reading if it is a regular file (following symbolic links). Opened
/// without blocking, so that a FIFO in its place is found out rather than waited on.
fn open_regular(path: &Path) -> Option<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// The whole of the regular file `path` as UTF-8, if it is at most `bound` bytes.
fn read_text(path: &Path, bound: u64) -> Option<String> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(bound + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > bound {
        return None;
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUFFIXES: [&str; 5] = [
        ".py",
        ".pyc",
        ".cpython-312-x86_64-linux-gnu.so",
        ".abi3.so",
        ".so",
    ];

    fn suffixes() -> Vec<String> {
        SUFFIXES.map(String::from).to_vec()
    }

    /// Writes `dir/<name>.dist-info` with each `(file, contents)`.
    fn dist_info(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> DistInfo {
        let path = dir.join(format!("{name}.dist-info"));
        std::fs::create_dir_all(&path).unwrap();
        for (file, contents) in files {
            std::fs::write(path.join(file), contents).unwrap();
        }
        DistInfo { path }
    }

    fn names(set: BTreeSet<String>) -> Vec<String> {
        set.into_iter().collect()
    }

    #[test]
    fn the_headers_are_the_first_of_each_in_the_header_block_in_any_case() {
        let dir = tempfile::tempdir().unwrap();
        let dist = dist_info(
            dir.path(),
            "a-1",
            &[(
                "METADATA",
                b"Metadata-Version: 2.1\r\nname: Tabulate \r\nVERSION:0.9.0\r\nVersion: 2\r\n\r\nName: not-this\n",
            )],
        );
        assert_eq!(
            dist.headers(),
            Headers {
                name: Some("Tabulate".into()),
                version: Some("0.9.0".into())
            }
        );
        // A header block that ends with the file counts; one without a version says so.
        let dist = dist_info(dir.path(), "b-1", &[("METADATA", b"Name: b")]);
        assert_eq!(dist.headers().name.as_deref(), Some("b"));
        assert_eq!(dist.headers().version, None);
        // The body is never read: a description that is not UTF-8 does not matter.
        let dist = dist_info(
            dir.path(),
            "c-1",
            &[("METADATA", b"Name: c\nVersion: 3\n\n\xff\xfe")],
        );
        assert_eq!(dist.headers().version.as_deref(), Some("3"));
    }

    #[test]
    fn broken_or_hostile_metadata_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let unknown = Headers::default();
        // Missing, a directory, not UTF-8 in the headers.
        assert_eq!(dist_info(dir.path(), "a-1", &[]).headers(), unknown);
        let dist = dist_info(dir.path(), "b-1", &[]);
        std::fs::create_dir(dist.path().join("METADATA")).unwrap();
        assert_eq!(dist.headers(), unknown);
        let dist = dist_info(
            dir.path(),
            "c-1",
            &[("METADATA", b"Name: c\nVersion: \xff1\n")],
        );
        assert_eq!(dist.headers(), unknown);
        // A header block that never ends is not read to its end.
        let mut endless = b"Name: d\nVersion: 1\n".to_vec();
        endless.extend(
            std::iter::repeat_n(b"X-Filler: x\n", (HEADERS_BOUND / 12 + 1) as usize).flatten(),
        );
        let dist = dist_info(dir.path(), "d-1", &[("METADATA", &endless)]);
        assert_eq!(dist.headers(), unknown);
        // A FIFO is not waited on.
        let dist = dist_info(dir.path(), "e-1", &[]);
        nix::unistd::mkfifo(
            &dist.path().join("METADATA"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(dist.headers(), unknown);
        // A symbolic link to a regular file is read like it.
        let dist = dist_info(dir.path(), "f-1", &[("REAL", b"Name: f\nVersion: 6\n")]);
        std::os::unix::fs::symlink("REAL", dist.path().join("METADATA")).unwrap();
        assert_eq!(dist.headers().version.as_deref(), Some("6"));
    }

    #[test]
    fn top_level_txt_wins_over_record_when_it_names_anything() {
        let dir = tempfile::tempdir().unwrap();
        let record: &[u8] = b"bs4/__init__.py,sha256=x,1\nsoupsieve/__init__.py,,\n";
        let dist = dist_info(
            dir.path(),
            "beautifulsoup4-4.12.0",
            &[("top_level.txt", b"bs4\n  extra\n"), ("RECORD", record)],
        );
        assert_eq!(names(dist.provides(&suffixes())), ["bs4", "extra"]);
        let dist = dist_info(
            dir.path(),
            "empty-1",
            &[("top_level.txt", b"\n \n"), ("RECORD", record)],
        );
        assert_eq!(names(dist.provides(&suffixes())), ["bs4", "soupsieve"]);
    }

    #[test]
    fn record_paths_name_their_top_level_modules_as_importlib_infers_them() {
        let dir = tempfile::tempdir().unwrap();
        let record = concat!(
            "matplotlib/__init__.py,sha256=x,1\n",
            // A namespace package: no __init__.py anywhere.
            "mpl_toolkits/mplot3d/axes3d.py,,\n",
            "pylab.py,,\n",
            "six.cpython-312.pyc,,\n",
            "fast.cpython-312-x86_64-linux-gnu.so,,\n",
            "stable.abi3.so,,\n",
            // Another interpreter's extension: a module name with a dot.
            "old.cpython-311-x86_64-linux-gnu.so,,\n",
            "README,,\n",
            "matplotlib.libs/libz.so,,\n",
            "matplotlib-3.11.2.dist-info/RECORD,,\n",
            "../../bin/tool,,\n",
            "/abs/x.py,,\n",
            "\"quoted,dir/x.py\",,\n",
            "\"quoted\"\"q/x.py\",,\n",
            "\n",
            ",,\n",
        );
        let dist = dist_info(dir.path(), "m-1", &[("RECORD", record.as_bytes())]);
        assert_eq!(
            names(dist.provides(&suffixes())),
            [
                "fast",
                "matplotlib",
                "mpl_toolkits",
                "pylab",
                "quoted\"q",
                "quoted,dir",
                "stable"
            ]
        );
    }

    #[test]
    fn versions_come_from_the_first_provider_on_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("first"), dir.path().join("second"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        dist_info(
            &first,
            "numpy-2.0",
            &[
                ("METADATA", b"Name: numpy\nVersion: 2.0\n"),
                ("RECORD", b"numpy/__init__.py,,\n"),
            ],
        );
        dist_info(
            &second,
            "numpy-1.0",
            &[
                ("METADATA", b"Name: numpy\nVersion: 1.0\n"),
                ("RECORD", b"numpy/__init__.py,,\n"),
            ],
        );
        dist_info(
            &second,
            "matplotlib-3.0",
            &[
                ("METADATA", b"Name: matplotlib\nVersion: 3.0\n"),
                (
                    "RECORD",
                    b"matplotlib/__init__.py,,\nmpl_toolkits/a/b.py,,\n",
                ),
            ],
        );
        // Provides a name but declares no version: the name's version is unknown, not
        // taken from a later provider.
        dist_info(
            &first,
            "broken-0",
            &[
                ("METADATA", b"Name: broken\n"),
                ("RECORD", b"broken.py,,\n"),
            ],
        );
        dist_info(
            &second,
            "broken-9",
            &[
                ("METADATA", b"Name: broken\nVersion: 9\n"),
                ("RECORD", b"broken.py,,\n"),
            ],
        );
        let path = [
            dir.path().join("missing"),
            first.clone(),
            dir.path().join("second/numpy-1.0.dist-info/RECORD"),
            second,
        ];
        let names = ["numpy", "mpl_toolkits", "broken", "json", "numpy"].map(String::from);
        assert_eq!(
            versions_of(&path, &names, &suffixes()),
            [
                Some("2.0".into()),
                Some("3.0".into()),
                None,
                None,
                Some("2.0".into())
            ]
        );
        assert_eq!(versions_of(&[], &names[..1], &suffixes()), [None]);
    }
}
