//! The schema validator: the subset of JSON Schema that `docs/bench-schema.json` uses.

use serde_json::Value;

/// Keywords that only annotate: the validator reads past them.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "title",
    "description",
    "format",
    "examples",
    "default",
];

/// How deep `$ref`s may nest before the schema is taken to loop.
const MAX_DEPTH: usize = 64;

/// Checks `doc` against `schema`, for the subset of JSON Schema (draft 2020-12) that
/// `docs/bench-schema.json` uses: `type` (a name or an array of names, `null` among them for a
/// nullable field), `required`, `properties`, `additionalProperties` (`false` or a schema),
/// `items`, `enum`, `const`, `minimum`, `exclusiveMinimum`, and `$ref` to `#/...` within the
/// schema. `description`, `title`, `format` and the other annotations are read past; any other
/// keyword is an error, so that a schema cannot rely on a check that is silently skipped.
///
/// `integer` means a number written without a fraction or exponent (as serde reads an integer),
/// which is stricter than the specification's `1.0`.
///
/// On failure the message lists every field that is wrong, by JSON path (`$.runs[0].batch`),
/// separated by `; `.
pub fn validate_against_schema(doc: &Value, schema: &Value) -> Result<(), String> {
    let mut errors = Vec::new();
    check(doc, schema, schema, "$", 0, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn check(doc: &Value, schema: &Value, root: &Value, at: &str, depth: usize, errors: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        errors.push(format!("{at}: the schema's $refs nest deeper than {MAX_DEPTH}"));
        return;
    }
    let rules = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("{at}: not allowed here"));
            return;
        }
        Value::Object(rules) => rules,
        other => {
            errors.push(format!("{at}: the schema here is {other}, not an object"));
            return;
        }
    };
    for key in rules.keys() {
        let known = matches!(
            key.as_str(),
            "type"
                | "required"
                | "properties"
                | "additionalProperties"
                | "items"
                | "enum"
                | "const"
                | "minimum"
                | "exclusiveMinimum"
                | "$ref"
        );
        if !known && !ANNOTATIONS.contains(&key.as_str()) {
            errors.push(format!(
                "{at}: the schema uses `{key}`, which this validator does not know"
            ));
        }
    }
    if let Some(reference) = rules.get("$ref") {
        match reference.as_str().and_then(|r| resolve_ref(root, r)) {
            Some(target) => check(doc, target, root, at, depth + 1, errors),
            None => errors.push(format!("{at}: the schema's $ref {reference} leads nowhere")),
        }
    }
    if let Some(ty) = rules.get("type") {
        let names: Vec<&str> = match ty {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !names.iter().any(|n| has_type(doc, n)) {
            errors.push(format!(
                "{at}: expected {}, found {}",
                names.join(" or "),
                describe(doc)
            ));
            // The other checks would only repeat the mismatch.
            return;
        }
    }
    if let Some(expected) = rules.get("const") {
        if doc != expected {
            errors.push(format!("{at}: expected {expected}, found {}", describe(doc)));
        }
    }
    if let Some(Value::Array(options)) = rules.get("enum") {
        if !options.contains(doc) {
            let list: Vec<String> = options.iter().map(Value::to_string).collect();
            errors.push(format!(
                "{at}: expected one of {}, found {}",
                list.join(", "),
                describe(doc)
            ));
        }
    }
    if let (Some(min), Some(x)) = (rules.get("minimum").and_then(Value::as_f64), doc.as_f64()) {
        if x < min {
            errors.push(format!("{at}: {x} is below the minimum {min}"));
        }
    }
    if let (Some(min), Some(x)) = (
        rules.get("exclusiveMinimum").and_then(Value::as_f64),
        doc.as_f64(),
    ) {
        if x <= min {
            errors.push(format!("{at}: {x} must be greater than {min}"));
        }
    }
    if let Value::Object(fields) = doc {
        if let Some(Value::Array(required)) = rules.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !fields.contains_key(name) {
                    errors.push(format!("{at}.{name}: required field missing"));
                }
            }
        }
        let properties = rules.get("properties").and_then(Value::as_object);
        for (name, value) in fields {
            let path = format!("{at}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(sub) => check(value, sub, root, &path, depth + 1, errors),
                None => match rules.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        errors.push(format!("{path}: unknown field"));
                    }
                    Some(sub @ Value::Object(_)) => check(value, sub, root, &path, depth + 1, errors),
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(elements), Some(items)) = (doc, rules.get("items")) {
        for (i, element) in elements.iter().enumerate() {
            check(element, items, root, &format!("{at}[{i}]"), depth + 1, errors);
        }
    }
}

/// Follows a `#/a/b` JSON pointer within the schema.
fn resolve_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

fn has_type(doc: &Value, name: &str) -> bool {
    match name {
        "null" => doc.is_null(),
        "boolean" => doc.is_boolean(),
        "object" => doc.is_object(),
        "array" => doc.is_array(),
        "string" => doc.is_string(),
        "number" => doc.is_number(),
        "integer" => doc.is_i64() || doc.is_u64(),
        _ => false,
    }
}

fn describe(doc: &Value) -> String {
    let kind = match doc {
        Value::Null => return "null".to_string(),
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => return "an array".to_string(),
        Value::Object(_) => return "an object".to_string(),
    };
    let mut text = doc.to_string();
    if text.len() > 40 {
        let cut = (0..=40).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    format!("{kind} {text}")
}
