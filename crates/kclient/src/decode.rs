//! What the API server sends, decoded object by object, as client-go's reflector reads it
//! (`tools/cache/reflector.go` list pages, `apimachinery/pkg/watch` stream decoding): a list page
//! and a watch line, each item decoded as its kind on its own so that one undecodable object is
//! named ([`Undecodable`]) and the others kept. Pure functions of the bytes: the
//! [`informer`](crate::informer) drives them over HTTP, and the `kube_object` fuzz target drives
//! them with arbitrary bytes.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::Change;

/// The most of a text from the API server that goes to a log line or an error.
pub const EXCERPT: usize = 300;

/// At most [`EXCERPT`] characters of `text`, saying how long it was when cut.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT) {
        None => text.to_owned(),
        Some((i, _)) => format!("{}... ({} bytes in all)", &text[..i], text.len()),
    }
}

/// An object of the cluster that does not decode as its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    pub namespace: String,
    /// Empty when the object has no readable name.
    pub name: String,
    /// Why, as a bounded excerpt.
    pub reason: String,
    /// Whether it was an item of a (re-)list (then its `Replace` follows) or a watch event.
    pub listed: bool,
}

/// One page of a list: its objects that decode, those that do not, the list's resourceVersion
/// (empty when absent) and the continue token of the next page (`None` on the last).
#[derive(Debug)]
pub struct Page<K> {
    pub objects: Vec<K>,
    pub undecodable: Vec<Undecodable>,
    pub version: String,
    pub next: Option<String>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

#[derive(Deserialize)]
struct RawList<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

/// A list page (`{"metadata": {...}, "items": [...]}`), each item decoded on its own; an error
/// (with an excerpt of the text) when the page itself is not a list.
pub fn decode_page<K: DeserializeOwned>(text: &str) -> Result<Page<K>, String> {
    let page: RawList<'_> = serde_json::from_str(text).map_err(|e| {
        format!(
            "the list is not a list ({}): {}",
            excerpt(&e.to_string()),
            excerpt(text)
        )
    })?;
    let (mut objects, mut undecodable) = (Vec::new(), Vec::new());
    for item in page.items.unwrap_or_default() {
        match decode::<K>(item) {
            Ok(o) => objects.push(o),
            Err(u) => undecodable.push(Undecodable { listed: true, ..u }),
        }
    }
    Ok(Page {
        objects,
        undecodable,
        version: page.metadata.resource_version.unwrap_or_default(),
        next: page.metadata.continue_.filter(|c| !c.is_empty()),
    })
}

/// The object, or what it is (namespace and name, when readable) and why it does not decode.
pub(crate) fn decode<K: DeserializeOwned>(raw: &RawValue) -> Result<K, Undecodable> {
    serde_json::from_str::<K>(raw.get()).map_err(|e| {
        let loose: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or_default();
        let field = |f: &str| {
            loose
                .pointer(&format!("/metadata/{f}"))
                .and_then(serde_json::Value::as_str)
                .map(excerpt)
                .unwrap_or_default()
        };
        Undecodable {
            namespace: field("namespace"),
            name: field("name"),
            reason: excerpt(&e.to_string()),
            listed: false,
        }
    })
}

/// One watch line, as the informer acts on it.
#[derive(Debug)]
pub enum Event<K> {
    /// ADDED or MODIFIED (`Apply`), or DELETED (`Delete`), and the object's resourceVersion.
    Change { change: Change<K>, version: Option<String> },
    /// ADDED, MODIFIED or DELETED, of an object that does not decode. After a DELETED, which
    /// object went is not known for sure: the informer re-lists.
    Undecodable {
        undecodable: Undecodable,
        deleted: bool,
        version: Option<String>,
    },
    /// BOOKMARK: where to watch from next.
    Bookmark { version: Option<String> },
    /// ERROR: the Status's code (410: expired, re-list), reason and message (an excerpt).
    Error { code: u16, reason: String, message: String },
    /// A type Kubernetes does not send (an excerpt of the type and of the line): dropped.
    Unknown { type_: String, line: String },
    /// Not a JSON event (an event was lost: the informer re-lists).
    NotJson(String),
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    type_: String,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize, Default)]
struct Versioned {
    #[serde(default)]
    metadata: Meta,
}

/// A watch line (`{"type": ..., "object": {...}}`, without its newline).
pub fn decode_event<K: DeserializeOwned>(line: &[u8]) -> Event<K> {
    let text = String::from_utf8_lossy(line);
    let event: RawEvent<'_> = match serde_json::from_str(&text) {
        Ok(e) => e,
        Err(e) => {
            return Event::NotJson(format!(
                "a watch line is not a JSON event ({}): {}",
                excerpt(&e.to_string()),
                excerpt(&text)
            ));
        }
    };
    let null: Box<RawValue> = RawValue::from_string("null".to_owned()).unwrap_or_default();
    let object: &RawValue = event.object.unwrap_or(&null);
    let version = || {
        serde_json::from_str::<Versioned>(object.get())
            .unwrap_or_default()
            .metadata
            .resource_version
            .filter(|v| !v.is_empty())
    };
    match event.type_.as_str() {
        "BOOKMARK" => Event::Bookmark { version: version() },
        "ERROR" => {
            let status: kube::core::Status = serde_json::from_str(object.get()).unwrap_or_default();
            Event::Error {
                code: status.code,
                reason: excerpt(&status.reason),
                message: excerpt(&status.message),
            }
        }
        t @ ("ADDED" | "MODIFIED" | "DELETED") => {
            let deleted = t == "DELETED";
            match decode::<K>(object) {
                Ok(o) => Event::Change {
                    change: if deleted { Change::Delete(o) } else { Change::Apply(o) },
                    version: version(),
                },
                Err(undecodable) => Event::Undecodable {
                    undecodable,
                    deleted,
                    version: version(),
                },
            }
        }
        other => Event::Unknown {
            type_: excerpt(other),
            line: excerpt(&text),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_bounded_and_say_so() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(1000);
        let e = excerpt(&long);
        assert!(e.starts_with(&"é".repeat(EXCERPT)), "{e}");
        assert!(e.ends_with("... (2000 bytes in all)"), "{e}");
    }

    #[test]
    fn an_undecodable_item_is_named_with_its_defect() {
        #[derive(Deserialize, Debug)]
        struct Svc {
            #[allow(dead_code)]
            spec: std::collections::BTreeMap<String, u32>,
        }
        let raw: Box<RawValue> = serde_json::from_str(r#"{"metadata":{"name":"r","namespace":"ns"},"spec":[1]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let Err(u) = decode::<Svc>(&raw) else {
            panic!("a list is not a map")
        };
        assert_eq!((u.namespace.as_str(), u.name.as_str()), ("ns", "r"));
        assert!(u.reason.contains("invalid type: sequence"), "{}", u.reason);
    }

    #[test]
    fn a_page_keeps_what_decodes_and_names_the_rest() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Obj {
            n: u32,
        }
        let page = decode_page::<Obj>(
            r#"{"metadata":{"resourceVersion":"7","continue":"x"},"items":[{"n":1},{"n":"two","metadata":{"name":"b"}}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(page.objects, [Obj { n: 1 }]);
        assert_eq!(page.undecodable.len(), 1);
        assert!(page.undecodable[0].listed && page.undecodable[0].name == "b");
        assert_eq!((page.version.as_str(), page.next.as_deref()), ("7", Some("x")));
        assert!(decode_page::<Obj>("[1]").is_err_and(|e| e.starts_with("the list is not a list")));
    }

    #[test]
    fn watch_lines_are_classified() {
        #[derive(Deserialize, Debug)]
        struct Obj {
            #[allow(dead_code)]
            n: u32,
        }
        let ev = |l: &str| decode_event::<Obj>(l.as_bytes());
        assert!(matches!(
            ev(r#"{"type":"ADDED","object":{"n":1,"metadata":{"resourceVersion":"5"}}}"#),
            Event::Change { change: Change::Apply(_), version: Some(v) } if v == "5"
        ));
        assert!(matches!(
            ev(r#"{"type":"DELETED","object":{"n":"x"}}"#),
            Event::Undecodable { deleted: true, .. }
        ));
        assert!(matches!(
            ev(r#"{"type":"ERROR","object":{"code":410,"reason":"Expired"}}"#),
            Event::Error { code: 410, .. }
        ));
        assert!(
            matches!(ev(r#"{"type":"SURPRISE","object":{}}"#), Event::Unknown { type_, .. } if type_ == "SURPRISE")
        );
        assert!(matches!(ev(r#"{"type":"ADDED","obj"#), Event::NotJson(_)));
    }
}
