//! The bytecode of a new environment: every source has a pyc CPython uses without writing
//! one (workers cannot), the serving environment's pycs are linked for the sources a change
//! leaves alone, and only what changed is compiled.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use snakecage::envs::bytecode::{self, Bytecode};
use snakecage::envs::plan::Change;
use snakecage::envs::spec::Spec;
use snakecage::envs::{EnvManager, Prepare, Prepared};

use crate::harness::repo_root;
use crate::packages_env::env_config;

const TIMEOUT: Duration = Duration::from_secs(600);

fn python() -> PathBuf {
    repo_root().join(".venv/bin/python")
}

/// The interpreter's cache tag (`cpython-312`) and magic number.
fn tag_and_magic(python: &Path) -> (String, Vec<u8>) {
    let out = Command::new(python)
        .args([
            "-I",
            "-c",
            "import importlib.util, sys; print(sys.implementation.cache_tag, importlib.util.MAGIC_NUMBER.hex())",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (tag, magic) = text.trim().split_once(' ').unwrap();
    let magic = (0..magic.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&magic[i..i + 2], 16).unwrap())
        .collect();
    (tag.to_owned(), magic)
}

/// Every regular `.py` file below `dir`, no symbolic link followed, `__pycache__` skipped.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        let path = entry.path();
        if kind.is_dir() && entry.file_name() != "__pycache__" {
            found.extend(sources(&path));
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "py") {
            found.push(path);
        }
    }
    found
}

/// The pyc CPython looks for beside `source`.
fn pyc_of(source: &Path, tag: &str) -> PathBuf {
    let stem = source.file_stem().unwrap().to_str().unwrap();
    source
        .parent()
        .unwrap()
        .join("__pycache__")
        .join(format!("{stem}.{tag}.pyc"))
}

/// Each source below `site` but those in `unparsable` has a timestamp pyc whose header
/// CPython accepts for it (PEP 552: the magic number, flags 0, the source's mtime and
/// size); returns how many were checked.
fn assert_every_source_compiled(site: &Path, python: &Path, unparsable: &[&str]) -> usize {
    let (tag, magic) = tag_and_magic(python);
    let sources = sources(site);
    let mut checked = 0;
    for source in &sources {
        let pyc = pyc_of(source, &tag);
        if unparsable.iter().any(|name| source.ends_with(name)) {
            assert!(!pyc.exists(), "{} has bytecode", source.display());
            continue;
        }
        let meta = std::fs::metadata(source).unwrap();
        let bytes = std::fs::read(&pyc)
            .unwrap_or_else(|e| panic!("{} has no bytecode: {e}", source.display()));
        let mut want = magic.clone();
        want.extend(0u32.to_le_bytes());
        want.extend((meta.mtime() as u32).to_le_bytes());
        want.extend((meta.len() as u32).to_le_bytes());
        assert_eq!(
            bytes[..16],
            want[..],
            "{}: a header CPython rejects for {}",
            pyc.display(),
            source.display()
        );
        checked += 1;
    }
    checked
}

/// Imports `modules` with `python` from `path` (prepended to sys.path), writing no
/// bytecode (as a worker), and asserts CPython read each from its pyc, compiling no source
/// below `path`. Returns what the imports printed.
fn import_from_bytecode(python: &Path, path: &Path, modules: &[&str], print: &str) -> String {
    let code = format!(
        "import sys; sys.path.insert(0, {:?}); import {}; {print}",
        path.display().to_string(),
        modules.join(", ")
    );
    let out = Command::new(python)
        .args(["-I", "-B", "-v", "-c", &code])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let prefix = format!("# code object from {}", path.display());
    let from_source: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.ends_with(".py"))
        .collect();
    assert!(
        from_source.is_empty(),
        "compiled from source: {from_source:?}"
    );
    for module in modules {
        // `a.b` is `a/b/__init__.py` or `a/b.py`.
        let dir = path.join(module.replace('.', "/"));
        let (parent, leaf) = (dir.parent().unwrap(), dir.file_name().unwrap());
        let pycs = [
            format!("'{}/__pycache__/__init__.", dir.display()),
            format!("'{}/__pycache__/{}.", parent.display(), leaf.display()),
        ];
        assert!(
            stderr
                .lines()
                .filter_map(|l| l.strip_prefix("# code object from "))
                .any(|l| pycs.iter().any(|p| l.starts_with(p.as_str())) && l.ends_with(".pyc'")),
            "{module} not loaded from bytecode: {stderr}"
        );
    }
    String::from_utf8(out.stdout).unwrap()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn set_mtime(path: &Path, time: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(time)
        .unwrap();
}

fn inode(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.dev(), meta.ino())
}

#[tokio::test]
async fn only_a_pyc_compiled_from_the_same_source_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    let python = python();
    let (tag, _) = tag_and_magic(&python);
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for name in ["same", "copied", "touched", "edited", "stale", "linked_pyc"] {
        write(&old.join(format!("{name}.py")), "VALUE = 1\n");
    }
    write(&old.join("pkg/__init__.py"), "");
    write(&old.join("pkg/mod.py"), "VALUE = 1\n");
    write(&old.join("gone.py"), "VALUE = 1\n");
    for name in ["copied", "edited"] {
        set_mtime(&old.join(format!("{name}.py")), an_hour_ago);
    }
    // The previous environment's own bytecode, compiled with nothing to take from.
    let first = bytecode::compile(&python, &old, None, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        first,
        Bytecode {
            reused: 0,
            compiled: 9,
            unparsable: 0
        }
    );
    // Garbage a previous environment may hold: another Python's bytecode, a stale pyc,
    // a symbolic link to a pyc outside it.
    write(
        &old.join("__pycache__/same.cpython-311.pyc"),
        "not this one",
    );
    let stale = pyc_of(&old.join("stale.py"), &tag);
    let mut bytes = std::fs::read(&stale).unwrap();
    bytes[8] ^= 1;
    std::fs::write(&stale, bytes).unwrap();
    let linked = pyc_of(&old.join("linked_pyc.py"), &tag);
    let outside = dir.path().join("outside.pyc");
    std::fs::rename(&linked, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &linked).unwrap();

    // The new environment: hard links (as uv makes from its cache), a copy with the same
    // bytes and mtime, a copy touched since, an edit of the same size and mtime (its
    // header would still match: only the bytes tell), one source that is not Python, one new.
    for name in ["same", "stale", "linked_pyc", "pkg/__init__", "pkg/mod"] {
        let file = format!("{name}.py");
        std::fs::create_dir_all(new.join(&file).parent().unwrap()).unwrap();
        std::fs::hard_link(old.join(&file), new.join(&file)).unwrap();
    }
    write(&new.join("copied.py"), "VALUE = 1\n");
    set_mtime(&new.join("copied.py"), an_hour_ago);
    write(&new.join("touched.py"), "VALUE = 1\n");
    set_mtime(&new.join("touched.py"), an_hour_ago);
    write(&new.join("edited.py"), "VALUE = 2\n");
    set_mtime(&new.join("edited.py"), an_hour_ago);
    write(&new.join("not_python.py"), "print 'Python 2'\n");
    write(&new.join("added.py"), "VALUE = 1\n");

    let made = bytecode::compile(&python, &new, Some(&old), TIMEOUT)
        .await
        .unwrap();
    // What workers would see first: bytecode CPython uses for every source, its own.
    assert_eq!(
        assert_every_source_compiled(&new, &python, &["not_python.py"]),
        9
    );
    let out = import_from_bytecode(
        &python,
        &new,
        &[
            "same",
            "copied",
            "touched",
            "edited",
            "stale",
            "linked_pyc",
            "added",
            "pkg.mod",
        ],
        "print(edited.VALUE, pkg.mod.VALUE)",
    );
    assert_eq!(out, "2 1\n", "the edited source's own bytecode");
    // Reused where the source is the same; no stale, foreign or linked-out pyc taken.
    assert_eq!(
        made,
        Bytecode {
            reused: 4,
            compiled: 5,
            unparsable: 1
        }
    );
    for name in ["same", "copied", "pkg/__init__", "pkg/mod"] {
        let source = format!("{name}.py");
        assert_eq!(
            inode(&pyc_of(&new.join(&source), &tag)),
            inode(&pyc_of(&old.join(&source), &tag)),
            "{name} was not reused"
        );
    }
    for name in ["touched", "edited", "stale", "linked_pyc", "added"] {
        let pyc = pyc_of(&new.join(format!("{name}.py")), &tag);
        assert!(
            !std::fs::symlink_metadata(&pyc).unwrap().is_symlink(),
            "{name}"
        );
        assert_eq!(std::fs::metadata(&pyc).unwrap().nlink(), 1, "{name}");
    }
    // Nothing but the pycs of its own sources, for this Python.
    let mut cached: Vec<String> = std::fs::read_dir(new.join("__pycache__"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    cached.sort();
    let want: Vec<String> = [
        "added",
        "copied",
        "edited",
        "linked_pyc",
        "same",
        "stale",
        "touched",
    ]
    .iter()
    .map(|n| format!("{n}.{tag}.pyc"))
    .collect();
    assert_eq!(cached, want);

    // A previous environment that is gone: everything is compiled.
    let again = dir.path().join("again");
    write(&again.join("a.py"), "");
    let made = bytecode::compile(&python, &again, Some(&dir.path().join("missing")), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(made.compiled, 1);
}

#[tokio::test]
async fn a_directory_the_compiler_cannot_write_fails_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    write(&site.join("pkg/mod.py"), "VALUE = 1\n");
    // A file where `pkg/__pycache__` must go (root may write anywhere it may not).
    write(&site.join("pkg/__pycache__"), "");
    let err = bytecode::compile(&python(), &site, None, TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(err, bytecode::BytecodeError::Failed(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("compiling the new environment's bytecode failed: "),
        "{err}"
    );
    assert!(err.to_string().contains("__pycache__"), "{err}");
}

#[tokio::test]
async fn no_pth_file_of_the_new_environment_runs_while_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let out = Command::new(repo_root().join(".venv-tools/bin/uv"))
        .args(["venv", "--quiet", "--no-config", "--python"])
        .arg(python())
        .arg(&venv)
        .env("UV_PYTHON_DOWNLOADS", "never")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let site = snakecage::envs::dists::site_packages(&venv).unwrap();
    let marker = dir.path().join("ran");
    // A `.pth` line that starts with `import` runs whenever `site` processes the directory.
    write(
        &site.join("evil.pth"),
        &format!(
            "import pathlib; pathlib.Path({:?}).touch()\n",
            marker.display().to_string()
        ),
    );
    write(&site.join("module.py"), "VALUE = 1\n");
    let ran = Command::new(venv.join("bin/python"))
        .args(["-c", "pass"])
        .status()
        .unwrap()
        .success();
    assert!(ran && marker.exists(), "the .pth file does not run at all");
    std::fs::remove_file(&marker).unwrap();
    let made = bytecode::compile(&venv.join("bin/python"), &site, None, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(made.compiled, 1);
    assert!(!marker.exists(), "a .pth file ran on the host");
}

fn built(prepare: Prepare) -> Prepared {
    match prepare {
        Prepare::Built(prepared) => *prepared,
        Prepare::Unchanged(u) => panic!("nothing was built: {}", u.why),
    }
}

fn add(specs: &[&str]) -> Change {
    Change::Add {
        specs: specs.iter().map(|s| Spec::parse(s).unwrap()).collect(),
        constraints: Vec::new(),
    }
}

/// How many `.py` files `dist` installed, by its RECORD.
fn record_sources(site: &Path, dist: &str) -> usize {
    let record = std::fs::read_to_string(site.join(format!("{dist}.dist-info/RECORD"))).unwrap();
    record
        .lines()
        .filter(|l| l.split(',').next().unwrap().ends_with(".py"))
        .count()
}

#[tokio::test]
async fn a_change_compiles_only_what_changed_and_links_the_rest_from_the_serving_environment() {
    let state = tempfile::tempdir().unwrap();
    let mut config = env_config(state.path());
    let manager = EnvManager::open(&mut config).unwrap();

    // The first generation, on the base venv (whose pycs, if any, are pip's and do not fit
    // uv's files): every source compiled.
    let guard = manager.begin().unwrap();
    let first = built(
        guard
            .prepare(&add(&["six==1.16.0"]), &config)
            .await
            .unwrap(),
    );
    let first_site = first
        .config
        .python
        .layout()
        .unwrap()
        .site_packages
        .remove(0);
    let first_python = first.dir.join("bin/python");
    let total = assert_every_source_compiled(&first_site, &first_python, &[]);
    assert_eq!(
        first.bytecode.reused + first.bytecode.compiled,
        total as u64,
        "{:?}",
        first.bytecode
    );
    assert_eq!(first.bytecode.unparsable, 0);
    let live = first.config.clone();
    guard.commit(first).unwrap();
    drop(guard);

    // The next: six upgraded (the same file name, other bytes), tabulate added.
    let guard = manager.begin().unwrap();
    let next = built(
        guard
            .prepare(&add(&["six==1.17.0", "tabulate==0.9.0"]), &live)
            .await
            .unwrap(),
    );
    let site = next.config.python.layout().unwrap().site_packages.remove(0);
    let python = next.dir.join("bin/python");
    let total = assert_every_source_compiled(&site, &python, &[]);
    let out = import_from_bytecode(
        &python,
        &site,
        &["six", "tabulate", "numpy", "scipy.stats"],
        "print(six.__version__, tabulate.__version__)",
    );
    assert_eq!(out, "1.17.0 0.9.0\n");
    // Compiled: the two changed distributions' sources, nothing else; the rest is linked.
    let changed = record_sources(&site, "six-1.17.0") + record_sources(&site, "tabulate-0.9.0");
    assert_eq!(
        next.bytecode,
        Bytecode {
            reused: (total - changed) as u64,
            compiled: changed as u64,
            unparsable: 0
        }
    );
    let (tag, _) = tag_and_magic(&python);
    for unchanged in [
        "numpy/__init__.py",
        "pandas/core/frame.py",
        "scipy/stats/__init__.py",
    ] {
        assert_eq!(
            inode(&pyc_of(&site.join(unchanged), &tag)),
            inode(&pyc_of(&first_site.join(unchanged), &tag)),
            "{unchanged}: not the serving environment's bytecode"
        );
    }
    assert_ne!(
        inode(&pyc_of(&site.join("six.py"), &tag)),
        inode(&pyc_of(&first_site.join("six.py"), &tag)),
    );
}
