//! `encore serve` end to end: the binary started on a free port, driven over HTTP/1.1 with a
//! plain TCP client (no HTTP library between the test and the server's bytes).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{encore, models_dir, scratch, stderr};
use runtime::TensorValue;

/// A running `encore serve`; killed if the test ends without stopping it.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the server on a free port and waits until it says it is ready.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_encore"))
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("encore serve starts");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push_str(&format!("{line}\n"));
                if let Some(rest) = line.strip_prefix("encore serve: listening on http://") {
                    let addr = rest.split(',').next().unwrap().to_string();
                    let _ = tx.send(Ok(addr));
                } else if line.contains("ready in") {
                    let _ = tx.send(Err(()));
                }
            }
        });
        let deadline = Duration::from_secs(120);
        let addr = match rx.recv_timeout(deadline) {
            Ok(Ok(a)) => a,
            other => panic!(
                "no address from the server ({other:?}): {}",
                log.lock().unwrap()
            ),
        };
        // The listener is bound before the model loads: wait for "ready".
        match rx.recv_timeout(deadline) {
            Ok(Err(())) => {}
            other => panic!(
                "the server never became ready ({other:?}): {}",
                log.lock().unwrap()
            ),
        }
        Server { child, addr, log }
    }

    fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        http(&self.addr, method, path, body)
    }

    fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.request("POST", path, Some(body))
    }

    /// SIGTERM, then the exit status and the server's log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(50));
                let log = self.log.lock().unwrap().clone();
                return (status, log);
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the server did not stop: {}",
                self.log.lock().unwrap()
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

/// One HTTP/1.1 request with `Connection: close`; the status and the body.
fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the server");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("a whole response");
    let text = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_string())
}

/// The rows of a `[[f32, ...], ...]` body, each number parsed straight to the nearest f32 (as
/// it was printed from one), so that a bit-for-bit comparison is fair.
fn rows_of(body: &str) -> Vec<Vec<f32>> {
    let inner = body
        .trim()
        .strip_prefix("[[")
        .and_then(|b| b.strip_suffix("]]"))
        .unwrap_or_else(|| panic!("not a list of rows: {body}"));
    inner
        .split("],[")
        .map(|row| row.split(',').map(|x| x.parse::<f32>().unwrap()).collect())
        .collect()
}

/// Rows of an OpenAI `base64` response, in `index` order: the exact bits.
fn rows_of_base64(body: &str) -> Vec<Vec<f32>> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let mut data: Vec<(u64, String)> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().unwrap(),
                d["embedding"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    data.sort();
    data.iter()
        .map(|(_, b)| {
            decode_base64(b)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect()
}

/// Standard base64 with padding, by hand (the test needs no crate for it).
fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        let take = chunk.len() * 6 / 8;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    out
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// The first `n` movie snippets, and one text much longer than 128 tokens made of them.
fn texts(models: &Path, n: usize) -> Vec<String> {
    let file = models.join("data/movie_sentiment/test.jsonl");
    let all: Vec<String> = std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut out: Vec<String> = all[..n].to_vec();
    out.push(all[n..n + 12].join(" "));
    out
}

/// `encore embed --normalize --max-length 128` of `texts`: the rows the server must give.
fn embed_reference(dir: &Path, models: &Path, texts: &[String]) -> Vec<Vec<f32>> {
    let input = dir.join("texts.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = dir.join("emb.npy");
    let m = models.join("minilm-l6");
    let o = encore(&[
        "embed",
        "--model",
        m.join("model.onnx").to_str().unwrap(),
        "--tokenizer",
        m.join("tokenizer.json").to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--normalize",
        "--max-length",
        "128",
        "--batch-size",
        "7",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = TensorValue::read_npy(&out).unwrap();
    let h = t.shape()[1];
    t.as_f32().unwrap().chunks(h).map(<[f32]>::to_vec).collect()
}

fn minilm_server(models: &Path, extra: &[&str]) -> Server {
    let m = models.join("minilm-l6");
    let model = m.join("model.onnx");
    let tok = m.join("tokenizer.json");
    let mut args = vec![
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--max-input-length",
        "128",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// A small deterministic generator for groupings.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Every text's row from the server equals `encore embed`'s bit for bit, whatever request it
/// came in and whatever else the batcher put beside it: six clients send the texts in random
/// groups of 1 to 5, half through `/embed`, half through `/v1/embeddings` (base64: the bits).
#[test]
fn served_embeddings_are_bit_identical_to_encore_embed_whatever_the_batch() {
    let Some(models) = models_dir("served_embeddings_are_bit_identical") else {
        return;
    };
    let dir = scratch("serve_identity");
    let texts = texts(&models, 47);
    let reference = embed_reference(&dir, &models, &texts);
    let server = minilm_server(&models, &["--max-batch-tokens", "1024"]);
    let long = texts.len() - 1;
    let clients = 6;
    let barrier = Arc::new(Barrier::new(clients));
    std::thread::scope(|s| {
        for c in 0..clients {
            let (server, texts, reference, barrier) =
                (&server, &texts, &reference, barrier.clone());
            s.spawn(move || {
                let mut rng = Lcg(c as u64 + 1);
                let mut order: Vec<usize> = (0..texts.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i + 1));
                }
                barrier.wait();
                let mut at = 0;
                let mut request = 0;
                while at < order.len() {
                    let n = (1 + rng.below(5)).min(order.len() - at);
                    let group = &order[at..at + n];
                    at += n;
                    request += 1;
                    let inputs: Vec<String> = group.iter().map(|&i| json_str(&texts[i])).collect();
                    let truncate = group.contains(&long);
                    let rows = if request % 2 == 0 || truncate {
                        let body = format!(
                            "{{\"inputs\": [{}], \"truncate\": {truncate}}}",
                            inputs.join(",")
                        );
                        let (status, body) = server.post("/embed", &body);
                        assert_eq!(status, 200, "{body}");
                        rows_of(&body)
                    } else {
                        let body = format!(
                            "{{\"input\": [{}], \"model\": \"minilm\", \"encoding_format\": \"base64\"}}",
                            inputs.join(",")
                        );
                        let (status, body) = server.post("/v1/embeddings", &body);
                        assert_eq!(status, 200, "{body}");
                        rows_of_base64(&body)
                    };
                    assert_eq!(rows.len(), n);
                    for (row, &i) in rows.iter().zip(group) {
                        let same = row.len() == reference[i].len()
                            && row.iter().zip(&reference[i]).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "client {c}: text {i} differs from encore embed's row");
                    }
                }
            });
        }
    });
    let (_, metrics) = server.request("GET", "/metrics", None);
    let batches: f64 = metric(&metrics, "encore_batch_size_count");
    let served: f64 = metric(&metrics, "encore_texts_total");
    assert_eq!(served as usize, clients * texts.len(), "{metrics}");
    assert!(
        batches >= 1.0 && batches < served,
        "no batching happened: {metrics}"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Bad requests get JSON errors with the status TEI clients expect, and the server keeps
/// serving.
#[test]
fn bad_requests_get_json_errors_with_their_status() {
    let Some(models) = models_dir("bad_requests_get_json_errors") else {
        return;
    };
    let long = texts(&models, 1).pop().unwrap();
    let server = minilm_server(&models, &["--max-client-batch-size", "4"]);
    let error_type = |body: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {body}"));
        v["error_type"].as_str().unwrap_or_default().to_string()
    };
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/embed", r#"{"inputs": []}"#.into(), 422, "Validation"),
        (
            "/embed",
            r#"{"inputs": ["fine", "   "]}"#.into(),
            422,
            "Validation",
        ),
        (
            "/embed",
            r#"{"inputs": "unterminated"#.into(),
            422,
            "Validation",
        ),
        (
            "/embed",
            r#"{"text": "wrong field"}"#.into(),
            422,
            "Validation",
        ),
        (
            "/embed",
            r#"{"inputs": ["a","b","c","d","e"]}"#.into(),
            413,
            "Validation",
        ),
        (
            "/embed",
            format!("{{\"inputs\": {}}}", json_str(&long)),
            413,
            "Validation",
        ),
        (
            "/predict",
            r#"{"inputs": "an embedding model"}"#.into(),
            422,
            "Validation",
        ),
        (
            "/embed",
            r#"{"inputs": "x", "truncation_direction": "Left"}"#.into(),
            422,
            "Validation",
        ),
    ];
    for (path, body, status, kind) in &cases {
        let (got, text) = server.post(path, body);
        assert_eq!(got, *status, "{path} {body}: {text}");
        assert_eq!(error_type(&text), *kind, "{path} {body}: {text}");
    }
    // OpenAI's error shape on /v1.
    let (got, text) = server.post("/v1/embeddings", r#"{"input": [[1, 2, 3]]}"#);
    assert_eq!(got, 422, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("token arrays"),
        "{text}"
    );
    let (got, text) = server.request("GET", "/no/such/route", None);
    assert_eq!(got, 404, "{text}");
    assert!(text.contains("no route /no/such/route"), "{text}");
    // The long text with truncate: cut to 128 tokens, like `encore embed --max-length 128`.
    let (got, text) = server.post(
        "/embed",
        &format!("{{\"inputs\": {}, \"truncate\": true}}", json_str(&long)),
    );
    assert_eq!(got, 200, "{text}");
    assert_eq!(rows_of(&text)[0].len(), 384);
    let (got, info) = server.request("GET", "/info", None);
    assert_eq!(got, 200);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["max_input_length"], 128);
    assert_eq!(info["max_client_batch_size"], 4);
    assert_eq!(info["model_type"]["embedding"]["dimension"], 384);
    let (got, toks) = server.post("/tokenize", r#"{"inputs": "hello world"}"#);
    assert_eq!(got, 200);
    let toks: serde_json::Value = serde_json::from_str(&toks).unwrap();
    let ids: Vec<u64> = toks[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [101, 7592, 2088, 102], "{toks}");
    assert_eq!(toks[0][1]["start"], 0);
    assert_eq!(toks[0][1]["stop"], 5);
    let (_, metrics) = server.request("GET", "/metrics", None);
    assert!(
        metrics.contains(r#"encore_requests_total{route="/embed",status="413"} 2"#),
        "{metrics}"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// Beyond `--max-concurrent-requests` a request gets 429 at once; every admitted one is
/// answered whole.
#[test]
fn a_full_server_answers_429_and_loses_nothing() {
    let Some(models) = models_dir("a_full_server_answers_429") else {
        return;
    };
    let texts = texts(&models, 16);
    let server = minilm_server(&models, &["--max-concurrent-requests", "2"]);
    let body = format!(
        "{{\"inputs\": [{}]}}",
        texts[..16]
            .iter()
            .map(|t| json_str(t))
            .collect::<Vec<_>>()
            .join(",")
    );
    let clients = 16;
    let barrier = Arc::new(Barrier::new(clients));
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let (server, body, barrier) = (&server, &body, barrier.clone());
                s.spawn(move || {
                    barrier.wait();
                    let (status, text) = server.post("/embed", body);
                    match status {
                        200 => assert_eq!(rows_of(&text).len(), 16),
                        429 => assert!(text.contains("Overloaded"), "{text}"),
                        other => panic!("status {other}: {text}"),
                    }
                    status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    assert!(ok >= 1 && ok < clients, "statuses {statuses:?}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// SIGTERM while requests run: each accepted request still gets its whole answer, then the
/// server exits cleanly.
#[test]
fn sigterm_finishes_the_accepted_requests() {
    let Some(models) = models_dir("sigterm_finishes_the_accepted_requests") else {
        return;
    };
    let texts = texts(&models, 32);
    let server = minilm_server(&models, &[]);
    let body = format!(
        "{{\"inputs\": [{}]}}",
        texts[..32]
            .iter()
            .map(|t| json_str(t))
            .collect::<Vec<_>>()
            .join(",")
    );
    let addr = server.addr.clone();
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (addr, body) = (addr.clone(), body.clone());
            std::thread::spawn(move || http(&addr, "POST", "/embed", Some(&body)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (status, log) = server.stop();
    for c in clients {
        let (code, text) = c.join().unwrap();
        assert_eq!(code, 200, "{text}");
        assert_eq!(rows_of(&text).len(), 32);
    }
    assert!(status.success(), "{log}");
    assert!(
        log.contains("shutting down") && log.contains("stopped"),
        "{log}"
    );
}

/// A WordLevel tokenizer over a few words whose ids fit the tiny classifier's 1,000-row
/// vocabulary (MiniLM's would not).
fn tiny_tokenizer(path: &Path) {
    let words = [
        "good", "bad", "film", "plot", "acting", "great", "awful", "the", "a", "was",
    ];
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["[PAD]", "[UNK]", "[CLS]", "[SEP]"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for (i, w) in words.iter().enumerate() {
        vocab.insert(w.to_string(), (i + 4).into());
    }
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let tok = |id: &str, ty: u32| serde_json::json!({"SpecialToken": {"id": id, "type_id": ty}});
    let seq = |id: &str, ty: u32| serde_json::json!({"Sequence": {"id": id, "type_id": ty}});
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"), special(3, "[SEP]")],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [tok("[CLS]", 0), seq("A", 0), tok("[SEP]", 0)],
            "pair": [tok("[CLS]", 0), seq("A", 0), tok("[SEP]", 0), seq("B", 1), tok("[SEP]", 1)],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}
            }
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::write(path, json.to_string()).unwrap();
}

/// `/predict` on a classifier: labels from `--config`, softmax scores best first, text pairs,
/// the same logits as the session run directly; `/embed` on it is refused.
#[test]
fn predict_gives_the_sessions_probabilities_with_labels() {
    let Some(models) = models_dir("predict_gives_the_sessions_probabilities") else {
        return;
    };
    let dir = scratch("serve_predict");
    let tokenizer: PathBuf = dir.join("tokenizer.json");
    tiny_tokenizer(&tokenizer);
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"id2label": {"0": "negative", "1": "positive"}}"#,
    )
    .unwrap();
    let model = models.join("tiny/bert-cls/model.onnx");
    let server = Server::start(&[
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    let (got, text) = server.post(
        "/predict",
        r#"{"inputs": [["the film was good", "great acting"], "awful plot"]}"#,
    );
    assert_eq!(got, 200, "{text}");
    let served: serde_json::Value = serde_json::from_str(&text).unwrap();

    let tok = runtime::text::Tokenizer::from_file(&tokenizer, Default::default()).unwrap();
    let session = runtime::Session::new(
        &runtime::Model::load(&model).unwrap(),
        runtime::CompileOptions::default(),
    )
    .unwrap();
    let expected = [
        tok.encode_pairs(&[("the film was good", "great acting")])
            .unwrap(),
        tok.encode(&["awful plot"]).unwrap(),
    ];
    for (i, enc) in expected.iter().enumerate() {
        let out = session.run(&enc.feeds(&session)).unwrap();
        let logits = out[0].1.as_f32().unwrap().to_vec();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = logits.iter().map(|x| (x - max).exp()).collect();
        let p: Vec<f32> = e.iter().map(|x| x / e.iter().sum::<f32>()).collect();
        let best = if p[1] > p[0] { 1 } else { 0 };
        let names = ["negative", "positive"];
        let row = &served[i];
        assert_eq!(row[0]["label"], names[best], "{text}");
        assert_eq!(row[1]["label"], names[1 - best], "{text}");
        let score = row[0]["score"].as_f64().unwrap() as f32;
        assert!(
            (score - p[best]).abs() < 1e-6,
            "{score} vs {}: {text}",
            p[best]
        );
    }
    let (got, one) = server.post("/predict", r#"{"inputs": "good film", "raw_scores": true}"#);
    assert_eq!(got, 200, "{one}");
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(
        one.as_array().unwrap().len(),
        2,
        "a single input gives one list: {one}"
    );
    let (got, text) = server.post("/embed", r#"{"inputs": "good film"}"#);
    assert_eq!(got, 422, "{text}");
    let (_, info) = server.request("GET", "/info", None);
    assert!(
        info.contains(r#""id2label":{"0":"negative","1":"positive"}"#),
        "{info}"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}
