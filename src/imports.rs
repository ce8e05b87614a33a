//! The modules a piece of Python source imports, read statically (without running or
//! fully parsing it): `import a.b as c, d` and `from a.b import c` at any depth, inside
//! functions, `try`, `if` and one-line compound statements, skipping strings and comments.
//!
//! The scanner is a small tokenizer (names, dots, commas, brackets, logical line ends)
//! plus a pattern over its tokens: `import` is a hard keyword and appears only in import
//! statements; `from` starts one only when a dotted name and `import` follow it (not in
//! `yield from` or `raise … from`). Relative imports (`from . import x`) name local
//! modules and are left out. Dynamic imports (`__import__("x")`,
//! `importlib.import_module(...)`, `exec`) cannot be read here, only noticed ([`Scan`]
//! says so); code that hides even that (a name built at run time) is not noticed, so
//! callers must treat the result as a hint. Linear in the input, no recursion, never
//! panics on malformed code.

/// What a scan of some source found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// The absolute modules imported, each once, in order of first appearance.
    pub modules: Vec<String>,
    /// The code names `__import__`, `import_module`, `exec` or `eval`: it may import
    /// modules the scan cannot see.
    pub dynamic: bool,
    /// The code calls a `.plot`, `.hist` or `.boxplot` method (pandas draws those with
    /// matplotlib, importing it on first use).
    pub plots: bool,
    /// The code uses `async` or `await`: a top-level `await` runs on asyncio's event loop,
    /// and a coroutine is run by it, whether or not the code imports asyncio itself.
    pub asynchronous: bool,
}

/// Names whose use means imports may happen that no import statement shows.
const DYNAMIC: [&str; 4] = ["__import__", "import_module", "exec", "eval"];
/// Methods through which pandas imports matplotlib behind the caller's back.
const PLOTTING_METHODS: [&str; 3] = ["plot", "hist", "boxplot"];

/// Scans `source`: its imports, and the signs of imports it cannot see.
pub fn scan(source: &str) -> Scan {
    let tokens = Tokens::new(source).collect::<Vec<_>>();
    let dynamic = tokens
        .iter()
        .any(|t| matches!(t, Tok::Name(n) if DYNAMIC.contains(n)));
    let plots = tokens
        .windows(2)
        .any(|pair| matches!(pair, [Tok::Dot, Tok::Name(n)] if PLOTTING_METHODS.contains(n)));
    let asynchronous = tokens
        .iter()
        .any(|t| matches!(t, Tok::Name("async" | "await")));
    Scan {
        modules: modules_in(&tokens),
        dynamic,
        plots,
        asynchronous,
    }
}

/// The absolute modules `source` imports, each once, in order of first appearance
/// (`import a.b` gives `a.b`; `from a.b import c` gives `a.b`).
pub fn imported_modules(source: &str) -> Vec<String> {
    modules_in(&Tokens::new(source).collect::<Vec<_>>())
}

fn modules_in(tokens: &[Tok<'_>]) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut add = |name: String| {
        if !found.contains(&name) {
            found.push(name);
        }
    };
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i] {
            Tok::Name("from") => {
                let mut j = i + 1;
                let mut relative = false;
                while tokens.get(j) == Some(&Tok::Dot) {
                    relative = true;
                    j += 1;
                }
                let (name, next) = dotted(tokens, j);
                if tokens.get(next) == Some(&Tok::Name("import")) {
                    if let (Some(name), false) = (name, relative) {
                        add(name);
                    }
                    // Skip the imported names: they are not modules of an `import`.
                    i = next + 1;
                    while i < tokens.len() && tokens[i] != Tok::Newline {
                        i += 1;
                    }
                    continue;
                }
                i += 1;
            }
            Tok::Name("import") => {
                let mut j = i + 1;
                loop {
                    let (name, next) = dotted(tokens, j);
                    let Some(name) = name else { break };
                    add(name);
                    j = next;
                    if tokens.get(j) == Some(&Tok::Name("as")) {
                        j += 2;
                    }
                    if tokens.get(j) != Some(&Tok::Comma) {
                        break;
                    }
                    j += 1;
                }
                i = j;
            }
            _ => i += 1,
        }
    }
    found
}

/// The top-level package of a dotted module name: `matplotlib` for `matplotlib.pyplot`.
pub fn top_level(module: &str) -> &str {
    module.split('.').next().unwrap_or(module)
}

/// `a.b.c` starting at `tokens[start]`: the name, and the index after it.
fn dotted(tokens: &[Tok<'_>], start: usize) -> (Option<String>, usize) {
    let mut name = String::new();
    let mut i = start;
    loop {
        match tokens.get(i) {
            Some(Tok::Name(part)) if is_identifier(part) && !is_keyword(part) => {
                name.push_str(part);
                i += 1;
            }
            _ => return (None, start),
        }
        if tokens.get(i) == Some(&Tok::Dot) && matches!(tokens.get(i + 1), Some(Tok::Name(_))) {
            name.push('.');
            i += 1;
        } else {
            return (Some(name), i);
        }
    }
}

fn is_identifier(word: &str) -> bool {
    word.bytes().next().is_some_and(|b| !b.is_ascii_digit())
}

/// The keywords that can follow `import`/`from` in valid code but are not module names.
fn is_keyword(word: &str) -> bool {
    matches!(word, "import" | "as" | "from")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok<'a> {
    /// An identifier, keyword or number.
    Name(&'a str),
    Dot,
    Comma,
    /// The end of a logical line (a newline outside brackets), or `;`.
    Newline,
    /// Any other operator.
    Other,
}

/// The tokens of Python source, strings and comments skipped.
struct Tokens<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    /// Open brackets: newlines inside them do not end a logical line.
    depth: usize,
}

impl<'a> Tokens<'a> {
    fn new(src: &'a str) -> Self {
        Self {
            src,
            bytes: src.as_bytes(),
            pos: 0,
            depth: 0,
        }
    }

    /// Skips a string whose opening quote is at `self.pos`.
    fn skip_string(&mut self) {
        let quote = self.bytes[self.pos];
        let triple = self.bytes[self.pos..].starts_with(&[quote; 3]);
        self.pos += if triple { 3 } else { 1 };
        while self.pos < self.bytes.len() {
            let b = self.bytes[self.pos];
            if b == b'\\' {
                self.pos += 2; // an escaped character (raw strings too: r"\"" is one string)
                continue;
            }
            if triple {
                if self.bytes[self.pos..].starts_with(&[quote; 3]) {
                    self.pos += 3;
                    return;
                }
            } else if b == quote {
                self.pos += 1;
                return;
            } else if b == b'\n' || b == b'\r' {
                return; // unterminated: a syntax error; the line ends the string
            }
            self.pos += 1;
        }
        self.pos = self.pos.min(self.bytes.len());
    }
}

/// Whether `word` may prefix a string literal (`r`, `b`, `f`, `rb`, `fr`, ... any case).
fn is_string_prefix(word: &str) -> bool {
    word.len() <= 2
        && word
            .bytes()
            .all(|b| matches!(b.to_ascii_lowercase(), b'r' | b'b' | b'u' | b'f' | b't'))
}

fn is_name_byte(b: u8) -> bool {
    // Bytes of non-ASCII characters: outside strings and comments they can only be part of
    // an identifier (PEP 3131), and slicing at ASCII bytes keeps UTF-8 boundaries.
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Tok<'a>;

    fn next(&mut self) -> Option<Tok<'a>> {
        loop {
            let b = *self.bytes.get(self.pos)?;
            match b {
                b' ' | b'\t' | b'\x0c' => self.pos += 1,
                b'\\' => {
                    // A line continuation (or a stray backslash): never a line end.
                    self.pos += 1;
                    if self.bytes.get(self.pos) == Some(&b'\r') {
                        self.pos += 1;
                    }
                    if self.bytes.get(self.pos) == Some(&b'\n') {
                        self.pos += 1;
                    }
                }
                b'#' => {
                    while self.pos < self.bytes.len()
                        && !matches!(self.bytes[self.pos], b'\n' | b'\r')
                    {
                        self.pos += 1;
                    }
                }
                b'\n' | b'\r' => {
                    self.pos += 1;
                    if self.depth == 0 {
                        return Some(Tok::Newline);
                    }
                }
                b'\'' | b'"' => self.skip_string(),
                b';' => {
                    self.pos += 1;
                    return Some(Tok::Newline);
                }
                b'.' => {
                    self.pos += 1;
                    return Some(Tok::Dot);
                }
                b',' => {
                    self.pos += 1;
                    return Some(Tok::Comma);
                }
                b'(' | b'[' | b'{' => {
                    self.pos += 1;
                    self.depth += 1;
                    return Some(Tok::Other);
                }
                b')' | b']' | b'}' => {
                    self.pos += 1;
                    self.depth = self.depth.saturating_sub(1);
                    return Some(Tok::Other);
                }
                b if is_name_byte(b) => {
                    let start = self.pos;
                    while self.pos < self.bytes.len() && is_name_byte(self.bytes[self.pos]) {
                        self.pos += 1;
                    }
                    let word = &self.src[start..self.pos];
                    if matches!(self.bytes.get(self.pos), Some(b'\'' | b'"'))
                        && is_string_prefix(word)
                    {
                        self.skip_string();
                        continue;
                    }
                    return Some(Tok::Name(word));
                }
                _ => {
                    self.pos += 1;
                    return Some(Tok::Other);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(src: &str) -> Vec<String> {
        imported_modules(src)
    }

    #[test]
    fn every_import_form_names_its_module() {
        let src = "import os\nimport a.b as c, d\nfrom x.y import z\nfrom q import (r, s)\n\
                   from __future__ import annotations\nimport e as f, g.h\n";
        assert_eq!(
            scan(src),
            ["os", "a.b", "d", "x.y", "q", "__future__", "e", "g.h"]
        );
    }

    #[test]
    fn imports_at_any_depth_count() {
        let src = r#"
def f():
    import numpy as np
    class C:
        def g(self):
            from pandas import DataFrame
try:
    import scipy
except ImportError:
    import json
if True: import csv
with open("x") as fh: from matplotlib import pyplot
while False:
	import tabbed
"#;
        assert_eq!(
            scan(src),
            [
                "numpy",
                "pandas",
                "scipy",
                "json",
                "csv",
                "matplotlib",
                "tabbed"
            ]
        );
    }

    #[test]
    fn strings_and_comments_hide_nothing_real_and_show_nothing_fake() {
        let src = r#"
# import fake1
x = "import fake2"
y = 'from fake3 import a'
doc = """
import fake4
\"\"\" still inside
from fake5 import b
"""
z = '''a "" " import fake6 ''' ; import real1
r = r"\" import fake7" ; import real2
b = rb'''import fake8''' + F"{1} import fake9" + Br"import fake10"
it = 'it\'s import fake11'
import real3  # import fake12
"#;
        assert_eq!(scan(src), ["real1", "real2", "real3"]);
    }

    #[test]
    fn semicolons_continuations_and_brackets_join_or_split_statements() {
        let src = "x = 1; import numpy; from pandas import DataFrame\n\
                   import json, \\\n    csv\n\
                   from matplotlib \\\n  import pyplot\n\
                   from collections import (\n  OrderedDict,\n  deque,\n)\n\
                   import re\r\nimport io\rimport os\n";
        assert_eq!(
            scan(src),
            [
                "numpy",
                "pandas",
                "json",
                "csv",
                "matplotlib",
                "collections",
                "re",
                "io",
                "os"
            ]
        );
    }

    #[test]
    fn non_ascii_identifiers_and_text_are_read_correctly() {
        let src = "π = 3.14  # ñandú import nope\ns = \"ünïcödé import nope\"\n\
                   import módulo_ñ\nfrom 包 import 子\nvalue = π; import numpy\n";
        assert_eq!(scan(src), ["módulo_ñ", "包", "numpy"]);
    }

    #[test]
    fn from_outside_an_import_and_dynamic_imports_are_not_imports() {
        let src = "def g():\n    yield from range(3)\n\
                   try:\n    pass\nexcept Exception as e:\n    raise ValueError() from e\n\
                   m = __import__('pandas')\nimport importlib\nimportlib.import_module('numpy')\n\
                   import_ = 1\nfrom_x = 2\n";
        assert_eq!(scan(src), ["importlib"]);
    }

    #[test]
    fn relative_imports_are_local_and_left_out() {
        let src =
            "from . import a\nfrom .b import c\nfrom ..d.e import f\nfrom ... import g\nimport h\n";
        assert_eq!(scan(src), ["h"]);
    }

    #[test]
    fn duplicates_are_reported_once_in_order() {
        assert_eq!(
            scan("import b\nimport a\nfrom b import x\nimport a.c\n"),
            ["b", "a", "a.c"]
        );
    }

    #[test]
    fn malformed_code_never_panics() {
        for src in [
            "",
            "import",
            "import ,",
            "from",
            "from x",
            "from x import",
            "import a.",
            "import 3x",
            "'unterminated\nimport after_bad_string",
            "'''unterminated triple\nimport hidden",
            "\\",
            "x = '\\",
            "))))]]]}}} import after_closers",
            "((((( import inside_parens",
            "f'\\",
        ] {
            let _ = scan(src);
        }
        assert_eq!(
            scan("'unterminated\nimport after_bad_string"),
            ["after_bad_string"]
        );
        assert!(scan("'''unterminated triple\nimport hidden").is_empty());
        assert_eq!(scan("))))]]]}}} import after_closers"), ["after_closers"]);
    }

    #[test]
    fn huge_inputs_are_scanned_to_the_end() {
        let mut src = "x = 1\n".repeat(1_000_000);
        src.push_str(&"(".repeat(100_000));
        src.push_str(&")".repeat(100_000));
        src.push_str("\nimport numpy\n");
        src.push_str(&format!("s = '''{}'''\n", "import fake\n".repeat(100_000)));
        src.push_str("from pandas import DataFrame\n");
        assert_eq!(scan(&src), ["numpy", "pandas"]);
    }

    #[test]
    fn dynamic_imports_and_pandas_plotting_are_noticed() {
        assert!(!super::scan("import json\nprint(json.dumps(1))").dynamic);
        for src in [
            "pd = __import__('pandas')",
            "import importlib\nm = importlib.import_module('numpy')",
            "exec('import numpy')",
            "x = eval('1 + 1')",
        ] {
            assert!(super::scan(src).dynamic, "{src}");
        }
        // Only as names: in strings, comments or as parts of longer names they do not count.
        for src in [
            "s = '__import__'  # exec",
            "executor = 1\nevaluate = 2",
            "x.exec_ = 3",
        ] {
            assert!(!super::scan(src).dynamic, "{src}");
        }
        let plots =
            super::scan("import pandas as pd\ndf = pd.DataFrame({'a': [1]})\ndf.plot(kind='bar')");
        assert!(plots.plots);
        assert_eq!(plots.modules, ["pandas"]);
        assert!(super::scan("df['a'].hist()").plots);
        assert!(!super::scan("plot = 1\nprint(plot)").plots);
        assert!(!super::scan("s = 'df.plot()'").plots);
    }

    #[test]
    fn async_code_is_noticed_as_keywords_only() {
        for src in [
            "await tools.acall('x')",
            "async def f():\n    pass",
            "x = [await f() for f in fs]",
            "async with lock:\n    pass",
        ] {
            assert!(super::scan(src).asynchronous, "{src}");
        }
        for src in [
            "s = 'await me'  # async",
            "awaited = 1\nasync_mode = 2",
            "x.await_ = 3",
            "print('ça await')",
        ] {
            assert!(!super::scan(src).asynchronous, "{src}");
        }
    }

    #[test]
    fn the_top_level_package_is_the_first_part() {
        assert_eq!(top_level("matplotlib.pyplot"), "matplotlib");
        assert_eq!(top_level("numpy"), "numpy");
    }
}
