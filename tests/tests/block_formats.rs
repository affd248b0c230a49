//! The shaders' block layouts against the one definition (`tandem_backend_api::block`).
//!
//! The Vulkan kernels get theirs generated (`backend-vulkan/build.rs` writes `#define`s from the
//! table ahead of `common.glsl`); the WGSL decoders declare theirs as named constants by hand,
//! since the wgpu backend assembles its modules from the files as they are. These tests read the
//! shader sources and fail naming the file, the format and the field:
//!
//! - every layout constant a WGSL decoder (`shaders/wgsl/formats/`, `shaders/wgsl/dot/`)
//!   declares has the table's value, every block format's decoder declares its block size, and
//!   none writes its block's stride as a literal;
//! - `common.glsl` reads each block format's size from the generated defines; no Vulkan source
//!   (`common.glsl`, `shaders/vulkan/*.comp`) names a define the table does not generate, steps
//!   over blocks (`uint64_t(i) * N`) by a literal block size or by another format's
//!   `<FORMAT>_BYTES` than the one its code is built for, or writes a format's block size, its
//!   half-word or word count or its values per block as a literal `#define` in code built for
//!   that format. (A literal field offset is not checked: it is not told apart from other small
//!   numbers.)
//!
//! The decoders' values are checked by the conformance suite: `tests/src/cases.rs` runs matmuls
//! on every block format the GPU kernels take (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k: the
//! plain, prefill and integer-dot kernels) against an oracle decoded by `kit::quant`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tandem_backend_api::block::{self, BlockLayout};

/// The `shaders` folder; `TANDEM_SHADERS_DIR` points the checks at a copy (to see them fail on
/// a changed one without touching the tree).
fn shaders() -> PathBuf {
    std::env::var_os("TANDEM_SHADERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The files of `dir` ending in `ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

fn quantized() -> impl Iterator<Item = BlockLayout> {
    block::ALL.into_iter().filter(|l| l.is_quantized())
}

/// The layout whose name is `stem` (a file name such as `q4_k`), if it is a block format.
fn layout_named(stem: &str) -> Option<BlockLayout> {
    quantized().find(|l| l.name == stem)
}

/// The layout a constant name starts with (`Q4_K_QS`: q4_k) and the rest (`QS`).
fn split_constant(name: &str) -> Option<(BlockLayout, &str)> {
    quantized().find_map(|l| {
        let prefix = format!("{}_", l.name.to_uppercase());
        name.strip_prefix(&prefix).map(|rest| (l, rest))
    })
}

/// The code of a source line: without its `//` comment.
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// The decimal integer literals of a line of code (`18u`, `18`; not `0x12`, `1.5`, `x18`).
fn integer_literals(line: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts = c.is_ascii_digit()
            && (i == 0
                || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b'.'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_' || bytes[j] == b'.') {
            j += 1;
        }
        let token = &line[i..j];
        let digits = token.strip_suffix('u').unwrap_or(token);
        if let Ok(v) = digits.parse::<u64>() {
            out.push(v);
        }
        i = j;
    }
    out
}

/// The integer literals a line of code multiplies by (`* 18u`, `* (5u)`).
fn factors(line: &str) -> Vec<u64> {
    line.split('*')
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start().trim_start_matches('(').trim_start();
            let token: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect();
            integer_literals(&token)
                .first()
                .copied()
                .filter(|_| !token.contains('.'))
        })
        .collect()
}

/// `const NAME: u32 = VALUEu;` declarations of a WGSL source: (line number, name, value).
fn wgsl_u32_constants(source: &str) -> Vec<(usize, String, u64)> {
    source
        .lines()
        .enumerate()
        .filter_map(|(n, line)| {
            let rest = code(line).trim().strip_prefix("const ")?;
            let (name, rest) = rest.split_once(':')?;
            let value = rest.trim().strip_prefix("u32")?.trim().strip_prefix('=')?.trim();
            let value = value.strip_suffix(';')?.trim();
            let value = value.strip_suffix('u').unwrap_or(value).parse().ok()?;
            Some((n + 1, name.trim().to_string(), value))
        })
        .collect()
}

/// Every problem found in the WGSL decoders, one line each.
fn wgsl_problems(dirs: &[PathBuf]) -> Vec<String> {
    let table: BTreeMap<String, usize> = quantized().flat_map(|l| l.constants()).collect();
    let mut problems = Vec::new();
    for dir in dirs {
        for path in files(dir, "wgsl") {
            let source = read(&path);
            let file = path
                .strip_prefix(shaders())
                .unwrap_or(&path)
                .display()
                .to_string();
            let declared = wgsl_u32_constants(&source);
            for (line, name, value) in &declared {
                let Some((layout, field)) = split_constant(name) else {
                    continue;
                };
                match table.get(name) {
                    None => problems.push(format!(
                        "{file}:{line}: {name}: {} has no field {} (fields: {})",
                        layout.name,
                        field.to_lowercase(),
                        layout
                            .fields
                            .iter()
                            .map(|f| f.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    Some(&want) if want as u64 != *value => problems.push(format!(
                        "{file}:{line}: {name}: {} {} is {value} here, {want} in backend-api's block.rs",
                        layout.name,
                        field.to_lowercase(),
                    )),
                    Some(_) => {}
                }
            }
            // A block format's decoder: its stride from a checked constant, never a literal.
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let Some(layout) = layout_named(stem) else {
                continue;
            };
            let bytes_name = format!("{}_BYTES", layout.name.to_uppercase());
            if !declared.iter().any(|(_, n, _)| *n == bytes_name) {
                problems.push(format!(
                    "{file}: {} decoder without `const {bytes_name}: u32` (its block size)",
                    layout.name
                ));
            }
            let strides: Vec<u64> = [1, 4, 16]
                .into_iter()
                .filter(|unit| layout.bytes % unit == 0)
                .map(|unit| (layout.bytes / unit) as u64)
                .collect();
            for (n, line) in source.lines().enumerate() {
                if code(line).trim_start().starts_with("const ") {
                    continue;
                }
                if let Some(v) = factors(code(line)).into_iter().find(|v| strides.contains(v)) {
                    problems.push(format!(
                        "{file}:{}: {} block stride written as the literal {v} (bytes, words or 16-byte \
                         units of {} bytes): use {bytes_name}",
                        n + 1,
                        layout.name,
                        layout.bytes
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn wgsl_decoders_agree_with_the_block_table() {
    let wgsl = shaders().join("wgsl");
    let problems = wgsl_problems(&[wgsl.join("formats"), wgsl.join("dot")]);
    assert!(
        problems.is_empty(),
        "WGSL block layouts:\n{}",
        problems.join("\n")
    );
    // The check sees something: every block format the wgpu backend decodes declares constants.
    let declared: usize = [wgsl.join("formats"), wgsl.join("dot")]
        .iter()
        .flat_map(|d| files(d, "wgsl"))
        .map(|p| {
            wgsl_u32_constants(&read(&p))
                .iter()
                .filter(|(_, n, _)| split_constant(n).is_some())
                .count()
        })
        .sum();
    assert!(
        declared >= 28,
        "only {declared} layout constants found in the WGSL decoders"
    );
}

/// The formats a preprocessor condition names (`defined(WFMT_Q4_0) || defined(WFMT_Q4_1)`),
/// as table names.
fn wfmt_formats(condition: &str) -> Vec<&'static str> {
    block::ALL
        .iter()
        .map(|l| l.name)
        .filter(|name| {
            let token = format!("WFMT_{}", name.to_uppercase());
            condition.match_indices(&token).any(|(i, _)| {
                !condition[i + token.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        .collect()
}

/// The formats the preprocessor lets reach each line of a GLSL source (by `WFMT_` conditions),
/// one entry per line: empty where no `WFMT_` condition applies. Directive lines other than
/// `#if`/`#elif`/`#else`/`#endif` (a `#define`) take the formats of the branch they are in.
fn glsl_reach(source: &str) -> Vec<Vec<&'static str>> {
    // Per open #if: the formats of the branches so far, and the formats of the current one
    // (None where the branch names no format).
    let mut stack: Vec<(Vec<&'static str>, Option<Vec<&'static str>>)> = Vec::new();
    let all: Vec<&'static str> = block::ALL.iter().map(|l| l.name).collect();
    let effective = |stack: &[(Vec<&'static str>, Option<Vec<&'static str>>)]| -> Option<Vec<&'static str>> {
        stack.iter().rev().find_map(|(_, cur)| cur.clone())
    };
    let mut out = Vec::new();
    for line in source.lines() {
        let t = line.trim_start();
        if let Some(cond) = t.strip_prefix("#if") {
            let f = wfmt_formats(cond);
            let cur = (!f.is_empty()).then_some(f.clone());
            stack.push((f, cur));
        } else if let Some(cond) = t.strip_prefix("#elif") {
            let parent = effective(&stack[..stack.len() - 1]).unwrap_or_else(|| all.clone());
            let top = stack.last_mut().expect("#elif inside #if");
            let f = wfmt_formats(cond);
            top.0.extend(&f);
            top.1 = (!f.is_empty()).then(|| f.into_iter().filter(|x| parent.contains(x)).collect());
        } else if t.starts_with("#else") {
            let parent = effective(&stack[..stack.len() - 1]).unwrap_or_else(|| all.clone());
            let top = stack.last_mut().expect("#else inside #if");
            top.1 =
                (!top.0.is_empty()).then(|| parent.iter().copied().filter(|x| !top.0.contains(x)).collect());
        } else if t.starts_with("#endif") {
            stack.pop();
        }
        out.push(effective(&stack).unwrap_or_default());
    }
    out
}

/// What a block address multiplies its index by.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stride {
    /// An integer literal (`144u`).
    Literal(u64),
    /// A name (`Q4_K_BYTES`, `p.row_bytes`).
    Name(String),
}

/// Every `uint64_t(...) * N` (a block address: index times block size) of a GLSL source with the
/// formats the preprocessor lets reach it: (line number, N, formats; empty where no `WFMT_`
/// condition applies).
fn glsl_strides(source: &str) -> Vec<(usize, Stride, Vec<&'static str>)> {
    let reach = glsl_reach(source);
    let mut out = Vec::new();
    for (n, line) in source.lines().enumerate() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut rest = code(line);
        while let Some(i) = rest.find("uint64_t(") {
            rest = &rest[i + "uint64_t(".len()..];
            // Skip to the matching parenthesis.
            let mut depth = 1;
            let mut end = 0;
            for (k, ch) in rest.char_indices() {
                match ch {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = k + 1;
                    break;
                }
            }
            let after = rest[end..].trim_start();
            let Some(m) = after.strip_prefix('*') else {
                continue;
            };
            let token: String = m
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
                .collect();
            let stride = match integer_literals(&token).first() {
                Some(&v) if token.starts_with(|c: char| c.is_ascii_digit()) => Stride::Literal(v),
                _ if !token.is_empty() && !token.starts_with(|c: char| c.is_ascii_digit()) => {
                    Stride::Name(token)
                }
                _ => continue,
            };
            out.push((n + 1, stride, reach[n].clone()));
        }
    }
    out
}

/// Every `#define NAME VALUE` of a GLSL source whose value is a bare integer literal, with the
/// formats that reach it: (line number, name, value, formats).
fn glsl_literal_defines(source: &str) -> Vec<(usize, String, u64, Vec<&'static str>)> {
    let reach = glsl_reach(source);
    source
        .lines()
        .enumerate()
        .filter_map(|(n, line)| {
            let rest = code(line).trim_start().strip_prefix("#define")?;
            let mut words = rest.split_whitespace();
            let name = words.next()?;
            let value = words.next()?;
            if words.next().is_some() || name.contains('(') {
                return None;
            }
            let value = value.strip_suffix('u').unwrap_or(value).parse().ok()?;
            Some((n + 1, name.to_string(), value, reach[n].clone()))
        })
        .collect()
}

#[test]
fn glsl_decoders_read_the_generated_layout() {
    let vulkan = shaders().join("vulkan");
    let common = read(&vulkan.join("common.glsl"));
    let generated: BTreeMap<String, usize> = quantized().flat_map(|l| l.constants()).collect();
    let mut problems = Vec::new();
    // common.glsl: each block format it decodes takes its size from the generated define.
    for layout in quantized() {
        let wfmt = format!("WFMT_{}", layout.name.to_uppercase());
        let bytes = format!("{}_BYTES", layout.name.to_uppercase());
        if common.contains(&wfmt) && !common.contains(&bytes) {
            problems.push(format!(
                "common.glsl: the {} decoder does not read {bytes}",
                layout.name
            ));
        }
    }
    // Every source:
    // - names no layout define the build does not write (an undefined name in `#if` is 0);
    // - steps over blocks (`uint64_t(i) * N`) by a generated `<FORMAT>_BYTES`, that of the one
    //   format the code is built for where it is built for one, never by a literal block size;
    //   a float format's (which has no define) literal stride is its value size;
    // - writes no block size, half-word or word count, or values per block of the one format a
    //   branch is built for as a literal `#define` (matmul_cm2's HALVES, WORDS, BS).
    let mut by_name = 0;
    for path in std::iter::once(vulkan.join("common.glsl")).chain(files(&vulkan, "comp")) {
        let file = path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        let source = read(&path);
        for (n, line) in source.lines().enumerate() {
            for word in code(line).split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if split_constant(word).is_some() && !generated.contains_key(word) {
                    let (layout, field) = split_constant(word).expect("checked");
                    problems.push(format!(
                        "{file}:{}: {word}: {} has no field {} in backend-api's block.rs",
                        n + 1,
                        layout.name,
                        field.to_lowercase()
                    ));
                }
            }
        }
        for (line, stride, formats) in glsl_strides(&source) {
            let one = match formats[..] {
                [name] => block::ALL.into_iter().find(|l| l.name == name),
                _ => None,
            };
            match stride {
                Stride::Literal(v) => {
                    if let Some(layout) = quantized().find(|l| l.bytes as u64 == v) {
                        if one.is_none_or(|o| o.name == layout.name) {
                            problems.push(format!(
                                "{file}:{line}: {} block stride written as the literal {v}: use {}_BYTES",
                                layout.name,
                                layout.name.to_uppercase()
                            ));
                            continue;
                        }
                    }
                    match one {
                        Some(layout) if layout.is_quantized() => problems.push(format!(
                            "{file}:{line}: {} blocks stepped over by the literal {v}: use {}_BYTES ({})",
                            layout.name,
                            layout.name.to_uppercase(),
                            layout.bytes
                        )),
                        Some(layout) if v != layout.bytes as u64 => problems.push(format!(
                            "{file}:{line}: {} values stepped over by {v} bytes; backend-api's block.rs has {}",
                            layout.name, layout.bytes
                        )),
                        _ => {}
                    }
                }
                Stride::Name(name) => {
                    let Some((layout, field)) = split_constant(&name) else {
                        continue;
                    };
                    by_name += 1;
                    if field != "BYTES" {
                        problems.push(format!(
                            "{file}:{line}: blocks stepped over by {name}, not a block size: use {}_BYTES",
                            layout.name.to_uppercase()
                        ));
                    } else if let Some(o) = one.filter(|o| o.name != layout.name) {
                        problems.push(format!(
                            "{file}:{line}: {} blocks stepped over by {name}: use {}_BYTES",
                            o.name,
                            o.name.to_uppercase()
                        ));
                    }
                }
            }
        }
        for (line, name, v, formats) in glsl_literal_defines(&source) {
            let [f] = formats[..] else {
                continue;
            };
            let Some(layout) = layout_named(f) else {
                continue;
            };
            let upper = layout.name.to_uppercase();
            // Bytes, 16-bit halves and 32-bit words per block (where whole), values per block.
            let mut derived: Vec<(usize, String)> = [(1, ""), (2, " / 2"), (4, " / 4")]
                .into_iter()
                .filter(|(unit, _)| layout.bytes % unit == 0)
                .map(|(unit, div)| match div {
                    "" => (layout.bytes, format!("{upper}_BYTES")),
                    _ => (layout.bytes / unit, format!("({upper}_BYTES{div})")),
                })
                .collect();
            derived.push((layout.elems, format!("{upper}_ELEMS")));
            if let Some((_, expr)) = derived.iter().find(|(value, _)| *value as u64 == v) {
                problems.push(format!(
                    "{file}:{line}: #define {name} {v} in {} code: write it as {expr}",
                    layout.name
                ));
            }
        }
    }
    eprintln!("{by_name} block strides read from the generated defines in the Vulkan sources");
    assert!(
        problems.is_empty(),
        "GLSL block layouts:\n{}",
        problems.join("\n")
    );
    // The check sees something: common.glsl's decoders and the kernels' own block addresses.
    assert!(
        by_name >= 14,
        "only {by_name} block strides from the generated defines found in the Vulkan sources"
    );
}

#[test]
fn the_parsers_see_what_they_check() {
    assert_eq!(integer_literals("b + 18u * x1 + 0x12u + 2.5 + 7"), [18, 7]);
    assert_eq!(factors("(g >> 3u) * 18u + v >> 24u * (5u) * 2.0 * x"), [18, 5]);
    assert_eq!(
        wgsl_u32_constants("// c\nconst Q4_0_BYTES: u32 = 18u;\nconst GROUP: u32 = 4u;\nlet x = 1u;"),
        [(2, "Q4_0_BYTES".to_string(), 18), (3, "GROUP".to_string(), 4)]
    );
    let glsl = "#if defined(WFMT_Q4_0) || defined(WFMT_Q4_1)\n#if defined(WFMT_Q4_0)\n\
                uint64_t b = row + uint64_t(u) * 18u;\n#else\nuint64_t b = row + uint64_t(u) * 21;\n\
                #endif\n#elif defined(WFMT_Q8_0)\nuint64_t b = row + uint64_t(u >> 3) * Q8_0_BYTES;\n\
                #define HALVES 17\n#endif\nuint64_t c = uint64_t(x) * 4;\n#define W (Q4_K_BYTES / 4)\n";
    assert_eq!(
        glsl_strides(glsl),
        [
            (3, Stride::Literal(18), vec!["q4_0"]),
            (5, Stride::Literal(21), vec!["q4_1"]),
            (8, Stride::Name("Q8_0_BYTES".to_string()), vec!["q8_0"]),
            (11, Stride::Literal(4), vec![])
        ]
    );
    assert_eq!(
        glsl_literal_defines(glsl),
        [(9, "HALVES".to_string(), 17, vec!["q8_0"])]
    );
    assert_eq!(
        wfmt_formats("defined(WFMT_Q4_K) && !defined(WFMT_Q4_KX)"),
        ["q4_k"]
    );
}
