//! How deep JSON nests, measured without recursion, and the one limit on the depth of a
//! tool call's arguments and of its result ([`MAX_TOOL_JSON_DEPTH`]).
//!
//! Depth counts arrays and objects within one another: a scalar is 0 levels deep, `[1]`
//! and `{"a": 1}` are 1, `[[1]]` and `{"a": [1]}` are 2. Of a call's arguments (an object
//! of keyword arguments) each argument is measured on its own: `f(x=[[1]])` passes an
//! argument 2 levels deep.
//!
//! The worker checks a call's arguments before it sends anything, and user code gets
//! `ToolLimitError` saying how deep the argument was; the supervisor checks every call
//! again (a worker that sends a deeper one wrote to its job socket itself, and is killed),
//! and holds every result and error `data` to the same limit before it goes back.

use serde_json::Value;

/// How deep a tool call's argument, result or error `data` may nest. Real payloads (API
/// responses, schema-described arguments) rarely nest past 20 levels; 64 leaves room for
/// them all. It stays well inside what every hop can decode: serde_json, the supervisor's
/// and the worker's frame codec alike, stops at 127 levels of a whole message (see
/// [`crate::frame::MAX_FRAME_DEPTH`]), and the envelopes around a value add a few (a
/// frame and its arguments object: 2; the caller's answer body: 2; an MCP server's
/// JSON-RPC response: 2 or 3), so the limit, not a parser, decides, whichever way the
/// value came. Half the depth is also half the stack the worker's tool threads (512 KiB
/// each) need to read an answer.
pub const MAX_TOOL_JSON_DEPTH: usize = 64;

/// The refusal of a value nested too deep: `what` ("argument 'x' of tool 'f'", "the
/// tool's result") is `depth` levels deep. One wording for the worker and the supervisor.
pub fn too_deep(what: &str, depth: usize) -> String {
    format!(
        "{what} is nested {depth} levels deep, deeper than the {MAX_TOOL_JSON_DEPTH} levels a \
         tool's arguments and results may nest (arrays and objects within one another)"
    )
}

/// How deep `value` nests. Iterative: a value deeper than any parser here makes cannot
/// exhaust the stack.
pub fn value_depth(value: &Value) -> usize {
    fn is_container(v: &&Value) -> bool {
        matches!(v, Value::Array(_) | Value::Object(_))
    }
    let mut deepest = 0;
    // Containers only, each with its own level.
    let mut stack: Vec<(&Value, usize)> = Vec::new();
    stack.extend(Some(value).filter(is_container).map(|v| (v, 1)));
    while let Some((v, level)) = stack.pop() {
        deepest = deepest.max(level);
        let inside = level + 1;
        match v {
            Value::Array(items) => {
                stack.extend(items.iter().filter(is_container).map(|c| (c, inside)));
            }
            Value::Object(members) => {
                stack.extend(members.values().filter(is_container).map(|c| (c, inside)));
            }
            _ => {}
        }
    }
    deepest
}

/// The member of an object nested deepest, and its depth (`None`: not an object, or an
/// empty one). Of a call's arguments, the argument to name in a refusal.
pub fn deepest_member(value: &Value) -> Option<(&str, usize)> {
    let members = value.as_object()?;
    members
        .iter()
        .map(|(name, v)| (name.as_str(), value_depth(v)))
        .fold(
            None,
            |best: Option<(&str, usize)>, (name, depth)| match best {
                Some((_, most)) if most >= depth => best,
                _ => Some((name, depth)),
            },
        )
}

/// Whether serde_json refused to parse text for nesting deeper than it goes (127 levels,
/// [`crate::frame::MAX_FRAME_DEPTH`]): JSON all the same, which [`text_depth`] measures.
pub fn too_deep_to_parse(error: &serde_json::Error) -> bool {
    error.classify() == serde_json::error::Category::Syntax
        && error.to_string().starts_with("recursion limit exceeded")
}

/// The result of a provider's JSON `text` (an HTTP tool's body, an MCP tool's text): what
/// serde_json makes of it (`Ok(None)`: it is not JSON), or, for JSON nested deeper than
/// serde_json goes, how deep it nests.
pub fn parse_result(text: &[u8]) -> Result<Option<Value>, usize> {
    match serde_json::from_slice(text) {
        Ok(value) => Ok(Some(value)),
        Err(e) if too_deep_to_parse(&e) => Err(text_depth(text).depth),
        Err(_) => Ok(None),
    }
}

/// How deep JSON text nests, and, when it is an object, its member nested deepest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDepth {
    /// The depth of the whole text.
    pub depth: usize,
    /// Of a top-level object: the byte range of its deepest member's key (quotes and
    /// escapes included, as written) and that member's depth.
    pub deepest_member: Option<(std::ops::Range<usize>, usize)>,
}

impl TextDepth {
    /// The deepest member's name, unescaped (`None` for text that is not an object).
    pub fn member_name(&self, text: &[u8]) -> Option<String> {
        let (key, _) = self.deepest_member.as_ref()?;
        serde_json::from_slice(text.get(key.clone())?).ok()
    }
}

/// Measures JSON text without parsing it: one pass, no recursion and no allocation, so it
/// measures text far deeper than serde_json parses (which is how a refusal can say how
/// deep such text was). Brackets inside strings do not count. Text that is not JSON is
/// measured all the same, by its brackets.
pub fn text_depth(text: &[u8]) -> TextDepth {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // Of a top-level object: where the next string is a key, the current member's key
    // and the most levels it reached, and the deepest member so far.
    let mut top_is_object = false;
    let mut expect_key = false;
    let mut key_start = 0;
    let mut key: Option<std::ops::Range<usize>> = None;
    let mut member_depth = 0usize;
    let mut deepest_member: Option<(std::ops::Range<usize>, usize)> = None;
    let mut finish_member = |key: &mut Option<std::ops::Range<usize>>, member_depth: &mut usize| {
        if let Some(key) = key.take() {
            let depth = std::mem::take(member_depth);
            if deepest_member
                .as_ref()
                .is_none_or(|(_, most)| depth > *most)
            {
                deepest_member = Some((key, depth));
            }
        }
    };
    for (i, &b) in text.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if expect_key {
                    expect_key = false;
                    key = Some(key_start..i + 1);
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                key_start = i;
            }
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if depth == 1 {
                    top_is_object = b == b'{';
                    expect_key = top_is_object;
                } else {
                    member_depth = member_depth.max(depth - 1);
                }
            }
            b']' | b'}' => {
                if depth == 1 && top_is_object {
                    finish_member(&mut key, &mut member_depth);
                }
                depth = depth.saturating_sub(1);
            }
            b',' if depth == 1 && top_is_object => {
                finish_member(&mut key, &mut member_depth);
                expect_key = true;
            }
            _ => {}
        }
    }
    TextDepth {
        depth: deepest,
        deepest_member,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(0), |inner, _| json!([inner]))
    }

    #[test]
    fn depth_counts_arrays_and_objects_within_one_another() {
        assert_eq!(value_depth(&json!(1)), 0);
        assert_eq!(value_depth(&json!([])), 1);
        assert_eq!(value_depth(&json!({"a": 1, "b": [2]})), 2);
        assert_eq!(value_depth(&json!([1, {"a": [[]]}, []])), 4);
        assert_eq!(value_depth(&nested(126)), 126);
        for text in [
            "1",
            "[]",
            r#"{"a": 1, "b": [2]}"#,
            r#"[1, {"a": [[]]}, []]"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(
                text_depth(text.as_bytes()).depth,
                value_depth(&value),
                "{text}"
            );
        }
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let text = r#"{"[[[": "]]]{{", "q\"[": ["\\", "\"[["]}"#;
        let measured = text_depth(text.as_bytes());
        assert_eq!(measured.depth, 2);
        assert_eq!(
            measured.member_name(text.as_bytes()).as_deref(),
            Some("q\"[")
        );
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(deepest_member(&value), Some(("q\"[", 1)));
    }

    #[test]
    fn the_deepest_argument_is_named_with_its_own_depth() {
        let arguments = json!({"flat": 1, "deep": nested(70), "mid": [[1]], "last": {}});
        assert_eq!(deepest_member(&arguments), Some(("deep", 70)));
        assert_eq!(deepest_member(&json!([1])), None);
        assert_eq!(deepest_member(&json!({})), None);
        let text = serde_json::to_string(&arguments).unwrap();
        let measured = text_depth(text.as_bytes());
        assert_eq!(measured.depth, 71);
        assert_eq!(measured.deepest_member.as_ref().map(|m| m.1), Some(70));
        assert_eq!(
            measured.member_name(text.as_bytes()).as_deref(),
            Some("deep")
        );
        // The first of equals is named; a scalar member is 0 levels deep.
        let text = br#"{"a": [1], "b": [2], "c": 3}"#;
        assert_eq!(text_depth(text).member_name(text).as_deref(), Some("a"));
        let text = br#"{"only": 3}"#;
        assert_eq!(text_depth(text).deepest_member.map(|m| m.1), Some(0));
        assert_eq!(text_depth(b"[[1]]").deepest_member, None);
    }

    /// Far deeper than serde_json parses, and no stack is used for it: a million levels.
    #[test]
    fn text_far_too_deep_to_parse_is_measured() {
        let levels = 1_000_000;
        let mut text = String::from(r#"{"x": "#);
        text.push_str(&"[".repeat(levels));
        text.push_str(&"]".repeat(levels));
        text.push('}');
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let measured = text_depth(text.as_bytes());
        assert_eq!(measured.depth, levels + 1);
        assert_eq!(measured.deepest_member.as_ref().map(|m| m.1), Some(levels));
        assert_eq!(measured.member_name(text.as_bytes()).as_deref(), Some("x"));
    }

    /// Text too deep to parse is told from text that is not JSON (serde_json's wording is
    /// pinned here: an update that changes it fails this test).
    #[test]
    fn results_too_deep_to_parse_say_how_deep() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(parse_result(deep.as_bytes()), Err(200));
        assert_eq!(parse_result(b"[[1]]"), Ok(Some(json!([[1]]))));
        assert_eq!(parse_result(b"[[ nicht json"), Ok(None));
        let unbalanced = "[".repeat(200);
        assert_eq!(parse_result(unbalanced.as_bytes()), Err(200));
    }

    #[test]
    fn the_refusal_names_the_depth_and_the_limit() {
        let message = too_deep("argument 'x' of tool 'f'", 126);
        assert!(message.starts_with("argument 'x' of tool 'f' is nested 126 levels deep"));
        assert!(message.contains("the 64 levels"), "{message}");
    }
}
