//! A small HTTP/1.1 client over `std::net::TcpStream` for the server tests (one request per
//! connection, `Connection: close`; chunked bodies; server-sent events read as they arrive),
//! and the server under test: `engine serve` started as a child process on an ephemeral port.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A whole response.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The body of a response, read as it arrives.
pub struct Body {
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes left in the current chunk (chunked), or in the body (`Content-Length`).
    left: Option<usize>,
    done: bool,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.chunked && self.left == Some(0) {
            // The CRLF after a chunk, then the next size line.
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            if line.trim().is_empty() {
                line.clear();
                self.reader.read_line(&mut line)?;
            }
            let size =
                usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("chunk size {line:?}: {e}"),
                    )
                })?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = Some(size);
        }
        let want = match self.left {
            Some(n) => buf.len().min(n),
            None => buf.len(),
        };
        let n = self.reader.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
        }
        if let Some(l) = self.left.as_mut() {
            *l -= n;
            if *l == 0 && !self.chunked {
                self.done = true;
            }
        }
        Ok(n)
    }
}

/// Sends a request; returns the status, the headers and the body, unread.
pub fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Body) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A body over the server's limit may be refused before it is all sent.
    let _ = s.write_all(body);
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let chunked = get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let left = if chunked {
        Some(0)
    } else {
        get("content-length").and_then(|v| v.parse().ok())
    };
    let done = left == Some(0) && !chunked;
    (
        status,
        headers,
        Body {
            reader,
            chunked,
            left,
            done,
        },
    )
}

/// A request, read whole.
pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let (status, headers, mut b) = send(addr, method, path, headers, body);
    let mut body = Vec::new();
    b.read_to_end(&mut body).expect("response body");
    Response {
        status,
        headers,
        body,
    }
}

/// POSTs `doc` as JSON.
pub fn post(addr: &str, path: &str, doc: &Value) -> Response {
    request(addr, "POST", path, &[], doc.to_string().as_bytes())
}

/// GETs `path`.
pub fn get(addr: &str, path: &str) -> Response {
    request(addr, "GET", path, &[], b"")
}

/// A stream of server-sent events.
pub struct Events {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    lines: BufReader<Body>,
}

impl Events {
    /// POSTs `doc` and returns its event stream.
    pub fn open(addr: &str, path: &str, doc: &Value) -> Events {
        let (status, headers, body) = send(addr, "POST", path, &[], doc.to_string().as_bytes());
        Events {
            status,
            headers,
            lines: BufReader::new(body),
        }
    }

    /// The next `data:` payload, or `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(d) = line.trim_end_matches(['\r', '\n']).strip_prefix("data:") {
                return Some(d.trim_start().to_string());
            }
        }
    }
}

/// `engine serve` as a child process on an ephemeral port of the loopback interface.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `engine serve --port 0 ARGS` from `engine` (the install's binary) and waits for
    /// the address it listens on. The port is chosen by the kernel when the server binds, so
    /// no other process can take it between choosing and binding.
    pub fn start(engine: &Path, args: &[&str]) -> Server {
        Self::start_with_env(engine, args, &[])
    }

    /// [`Server::start`] with `env` set for the server.
    pub fn start_with_env(engine: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(engine)
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .env_remove("TANDEM_PLUGIN_PATH")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("engine serve starts");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut line = String::new();
        let addr = loop {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.wait();
                panic!(
                    "engine serve exited before listening: {}{line}",
                    stderr.lock().unwrap()
                );
            }
            stderr.lock().unwrap().push_str(&line);
            if let Some(rest) = line.trim().strip_prefix("listening on http://") {
                break rest.split_whitespace().next().unwrap_or("").to_string();
            }
        };
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while err.read_line(&mut line).unwrap_or(0) > 0 {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Server { child, addr, stderr }
    }

    /// A sample of `/metrics` (`name{labels}` as written there).
    pub fn metric(&self, name: &str) -> f64 {
        let text = get(&self.addr, "/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// Waits until `cond` holds, for at most `secs` seconds.
    pub fn wait_for(&self, secs: u64, what: &str, mut cond: impl FnMut(&Server) -> bool) {
        let t = Instant::now();
        while !cond(self) {
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "timed out waiting for {what}; server stderr:\n{}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
