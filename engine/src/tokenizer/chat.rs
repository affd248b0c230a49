//! Chat prompts: a conversation rendered into the text the model was trained on.
//!
//! A model's own chat template (Jinja, from its tokenizer files) is rendered with minijinja the
//! way `transformers` renders it (`trim_blocks`, `lstrip_blocks`, `raise_exception`, a `tojson`
//! filter with Python's `json.dumps` spacing; the variables `messages`, `bos_token`,
//! `eos_token` and `add_generation_prompt`). Without a template, a built-in Gemma format is used
//! that produces the same text as Gemma 3's template.

use std::io;

use minijinja::value::{Kwargs, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the whole conversation (`"system"`).
    System,
    /// The person (`"user"`).
    User,
    /// The model (`"assistant"`; Gemma's template calls this turn `model` itself).
    Assistant,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// Errors from compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template does not compile (a Jinja syntax error).
    #[error("chat template does not compile: {0}")]
    Compile(String),
    /// Rendering failed: the template called `raise_exception(msg)` (the message is included),
    /// or an expression failed.
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// The conversation does not fit the built-in Gemma format.
    #[error("cannot render the conversation in the built-in Gemma format: {0}")]
    Messages(String),
}

/// The name the template is stored under in its environment (appears in error locations).
const TEMPLATE_NAME: &str = "chat_template";

/// The message of the error both Gemma formats give for roles that do not alternate.
const ALTERNATE_ROLES: &str = "Conversation roles must alternate user/assistant/user/assistant/...";

/// A compiled chat template, ready to render conversations.
pub struct ChatTemplate {
    format: Format,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

enum Format {
    /// A Jinja template from the model's files.
    Jinja(Box<Environment<'static>>),
    /// The built-in Gemma format.
    Gemma,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match &self.format {
            Format::Jinja(_) => "jinja",
            Format::Gemma => "built-in gemma",
        };
        f.debug_struct("ChatTemplate")
            .field("format", &format)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `template` (Jinja source, usually [`crate::tokenizer::Tokenizer::chat_template`]),
    /// or selects the built-in Gemma format when it is `None`. `bos_token` and `eos_token` are the
    /// texts of those tokens (`"<bos>"`), given to the template as `bos_token` / `eos_token`
    /// (undefined, so rendering as nothing, when `None`; the built-in format uses `"<bos>"`).
    pub fn new(
        template: Option<&str>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, ChatError> {
        let format = match template {
            None => Format::Gemma,
            Some(source) => Format::Jinja(Box::new(jinja_environment(source)?)),
        };
        Ok(ChatTemplate {
            format,
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// Renders `messages` into prompt text; with `add_generation_prompt`, the text ends with the
    /// start of a model turn (`<start_of_turn>model\n`) so that generation continues as the model.
    ///
    /// The text already contains the BOS token (`<bos>`), so encode it with
    /// `Tokenizer::encode(text, false)` (`add_special = false`), or the prompt gets two.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, ChatError> {
        match &self.format {
            Format::Gemma => render_gemma(
                messages,
                add_generation_prompt,
                self.bos_token.as_deref().unwrap_or("<bos>"),
            ),
            Format::Jinja(env) => {
                let template = env
                    .get_template(TEMPLATE_NAME)
                    .map_err(|e| ChatError::Render(error_text(&e)))?;
                let optional = |s: &Option<String>| match s {
                    Some(s) => Value::from(s.as_str()),
                    None => Value::UNDEFINED,
                };
                let ctx = minijinja::context! {
                    messages => Value::from_serialize(messages),
                    bos_token => optional(&self.bos_token),
                    eos_token => optional(&self.eos_token),
                    add_generation_prompt => add_generation_prompt,
                };
                template
                    .render(ctx)
                    .map_err(|e| ChatError::Render(error_text(&e)))
            }
        }
    }
}

/// An environment set up as `transformers`' `_compile_jinja_template`, holding `source`.
fn jinja_environment(source: &str) -> Result<Environment<'static>, ChatError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE_NAME, source.to_owned())
        .map_err(|e| ChatError::Compile(error_text(&e)))?;
    Ok(env)
}

/// A minijinja error with its chain of causes.
fn error_text(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `raise_exception(msg)`: fails rendering with `msg`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as `transformers` defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`,
/// so `", "` and `": "` separators when compact, no HTML escaping. `indent` may be given
/// positionally or by keyword; other keywords (`ensure_ascii`, `sort_keys`, `separators`) are
/// accepted and ignored.
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let formatter = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonCompact,
        )),
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, "JSON output is not UTF-8").with_source(e))?;
    Ok(Value::from_safe_string(text))
}

/// serde_json formatting with Python's default `json.dumps` separators (`", "`, `": "`).
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// The built-in Gemma format; gives exactly what Gemma 3's template gives for text messages:
///
/// ```text
/// <bos><start_of_turn>user
/// {system text}
///
/// {user text}<end_of_turn>
/// <start_of_turn>model
/// {assistant text}<end_of_turn>
/// <start_of_turn>user
/// ...
/// ```
///
/// A first system message is put before the first turn's text, followed by a blank line. The
/// remaining messages must alternate user/assistant starting with user; message texts (not the
/// system text) are trimmed.
fn render_gemma(messages: &[Message], add_generation_prompt: bool, bos: &str) -> Result<String, ChatError> {
    let Some(first) = messages.first() else {
        return Err(ChatError::Messages("there are no messages".into()));
    };
    let (first_prefix, turns) = match first.role {
        Role::System => (first.content.as_str(), &messages[1..]),
        _ => ("", messages),
    };
    let mut out = String::from(bos);
    for (i, m) in turns.iter().enumerate() {
        if (m.role == Role::User) != (i % 2 == 0) {
            return Err(ChatError::Messages(ALTERNATE_ROLES.into()));
        }
        let role = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "model",
        };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if i == 0 && first.role == Role::System {
            out.push_str(first_prefix);
            out.push_str("\n\n");
        }
        out.push_str(m.content.trim());
        out.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's chat template, from its `tokenizer_config.json`.
    const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

    fn conversation() -> Vec<Message> {
        vec![
            Message::new(Role::System, "Be brief."),
            Message::new(Role::User, " Hi there.\n"),
            Message::new(Role::Assistant, "Hello! "),
            Message::new(Role::User, "What is 2+2?"),
        ]
    }

    fn gemma3() -> ChatTemplate {
        ChatTemplate::new(Some(GEMMA3_TEMPLATE), Some("<bos>"), Some("<eos>")).unwrap()
    }

    #[test]
    fn builtin_gemma_format_is_exact() {
        let t = ChatTemplate::new(None, None, None).unwrap();
        assert_eq!(
            t.render(&conversation(), true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi there.<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nWhat is 2+2?<end_of_turn>\n\
             <start_of_turn>model\n"
        );
        let plain = [Message::new(Role::User, "Hi")];
        assert_eq!(
            t.render(&plain, false).unwrap(),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        );
    }

    #[test]
    fn gemma3_template_matches_builtin() {
        let builtin = ChatTemplate::new(None, Some("<bos>"), Some("<eos>")).unwrap();
        let real = gemma3();
        let conv = conversation();
        let cases: [&[Message]; 4] = [&conv, &conv[1..], &conv[..2], &conv[..1]];
        for messages in cases {
            for gen in [false, true] {
                assert_eq!(
                    real.render(messages, gen).unwrap(),
                    builtin.render(messages, gen).unwrap(),
                    "{messages:?} add_generation_prompt={gen}"
                );
            }
        }
    }

    #[test]
    fn roles_must_alternate() {
        let bad = [Message::new(Role::User, "a"), Message::new(Role::User, "b")];
        let err = gemma3().render(&bad, true).unwrap_err();
        assert!(matches!(err, ChatError::Render(_)), "{err:?}");
        assert!(err.to_string().contains(ALTERNATE_ROLES), "{err}");
        let err = ChatTemplate::new(None, None, None)
            .unwrap()
            .render(&bad, true)
            .unwrap_err();
        assert!(err.to_string().contains(ALTERNATE_ROLES), "{err}");
        let err = ChatTemplate::new(None, None, None)
            .unwrap()
            .render(&[], true)
            .unwrap_err();
        assert!(matches!(err, ChatError::Messages(_)), "{err:?}");
    }

    #[test]
    fn syntax_error_is_compile_error() {
        let err = ChatTemplate::new(Some("{% for m in messages %}"), None, None).unwrap_err();
        assert!(matches!(err, ChatError::Compile(_)), "{err:?}");
        let err = ChatTemplate::new(Some("{{ 1 + }}"), None, None).unwrap_err();
        assert!(matches!(err, ChatError::Compile(_)), "{err:?}");
    }

    #[test]
    fn raise_exception_message_is_kept() {
        let t = ChatTemplate::new(Some("{{ raise_exception('no tools here') }}"), None, None).unwrap();
        let err = t.render(&conversation(), false).unwrap_err();
        assert!(err.to_string().contains("no tools here"), "{err}");
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
        let t = ChatTemplate::new(Some(src), None, None).unwrap();
        let msgs = [
            Message::new(Role::User, "a"),
            Message::new(Role::Assistant, "b"),
            Message::new(Role::User, "c"),
        ];
        assert_eq!(t.render(&msgs, false).unwrap(), "[a]\n[c]\n");
    }

    #[test]
    fn variables_and_missing_tokens() {
        let src = "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ messages[0].role }}";
        let msgs = [Message::new(Role::Assistant, "x")];
        let t = ChatTemplate::new(Some(src), Some("<s>"), Some("</s>")).unwrap();
        assert_eq!(t.render(&msgs, true).unwrap(), "<s>|</s>|True|assistant");
        let t = ChatTemplate::new(Some(src), None, None).unwrap();
        assert_eq!(t.render(&msgs, false).unwrap(), "||False|assistant");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let msgs = [Message::new(Role::User, "héllo <b> & \"q\"")];
        let t = ChatTemplate::new(Some("{{ messages[0] | tojson }}"), None, None).unwrap();
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            r#"{"role": "user", "content": "héllo <b> & \"q\""}"#
        );
        let t = ChatTemplate::new(Some("{{ [1, 2] | tojson(indent=2) }}"), None, None).unwrap();
        assert_eq!(t.render(&msgs, false).unwrap(), "[\n  1,\n  2\n]");
    }

    /// The chat fixture's template (Gemma 3's) renders each conversation of its
    /// `chat_reference.json` as transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=True)` did (tests/fixtures/chat/make_chat_fixture.py made it), and
    /// so does the built-in Gemma format.
    #[test]
    fn the_chat_fixture_renders_as_transformers_does() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/gemma3-tiny-it");
        let tk = crate::tokenizer::Tokenizer::from_dir(&dir).unwrap();
        let jinja = ChatTemplate::new(tk.chat_template(), tk.bos_token(), tk.eos_token()).unwrap();
        assert!(matches!(jinja.format, Format::Jinja(_)));
        let builtin = ChatTemplate::new(None, tk.bos_token(), tk.eos_token()).unwrap();
        let text = std::fs::read_to_string(dir.join("chat_reference.json")).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 4);
        for case in cases {
            let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
            let want = case["text"].as_str().unwrap();
            assert_eq!(jinja.render(&messages, true).unwrap(), want);
            assert_eq!(builtin.render(&messages, true).unwrap(), want);
        }
    }

    #[test]
    fn role_serialises_lowercase() {
        assert_eq!(serde_json::to_string(&Role::Assistant).unwrap(), "\"assistant\"");
        let m: Message = serde_json::from_str(r#"{"role": "system", "content": "x"}"#).unwrap();
        assert_eq!(m, Message::new(Role::System, "x"));
    }
}
