//! Python code out of a model's markdown answer: the fenced ```python / ```py blocks, in
//! order, joined as one program. Everything outside them is prose and is ignored.

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// Info strings whose first word marks a block as Python.
const PYTHON_LANGS: [&str; 3] = ["python", "py", "python3"];

/// The Python blocks of `text`, joined with a blank line between them; `None` when there
/// is no Python block at all.
pub fn python_blocks(text: &str) -> Option<String> {
    let mut blocks: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                let lang = info
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                if PYTHON_LANGS.contains(&lang.as_str()) {
                    current = Some(String::new());
                }
            }
            Event::Text(t) => {
                if let Some(code) = current.as_mut() {
                    code.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(current.take()),
            _ => {}
        }
    }
    (!blocks.is_empty()).then(|| blocks.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_blocks_run_in_order_and_prose_is_ignored() {
        let text = "First I load it:\n\n```python\nx = 21\n```\n\nSome prose `inline`.\n\n```py\nprint(x * 2)\n```\n";
        assert_eq!(python_blocks(text).unwrap(), "x = 21\n\nprint(x * 2)\n");
    }

    #[test]
    fn other_languages_and_unlabelled_blocks_are_not_run() {
        let text = "```bash\nrm -rf /\n```\n\n```\nprint('no label')\n```\n\n    indented = True\n";
        assert_eq!(python_blocks(text), None);
        assert_eq!(python_blocks("just prose"), None);
    }

    #[test]
    fn info_strings_are_matched_on_their_first_word_case_insensitively() {
        let text = "~~~Python title=\"demo\"\nprint(1)\n~~~\n";
        assert_eq!(python_blocks(text).unwrap(), "print(1)\n");
    }
}
