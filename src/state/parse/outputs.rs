//! The root module's outputs: each value and type kept as compact JSON
//! text, a sensitive value wrapped.

use super::{Parser, Typed};
use crate::state::lexer::{Blocks, is_ws};
use crate::state::{Corruption, Json, Output, OutputValue, Sensitive};

/// Drops the whitespace outside strings from valid JSON text.
fn compact(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !is_ws(b) {
            out.push(b);
            in_string = b == b'"';
        }
    }
    out
}

impl<B: Blocks> Parser<B> {
    pub(super) fn outputs(&mut self) -> Result<(), Corruption> {
        self.parsed.outputs.clear();
        if !self.enter(b'{', "outputs is not an object")? {
            return Ok(());
        }
        let mut first = true;
        loop {
            let offset = self.src.offset();
            if !self.next_name(&mut first)? {
                return Ok(());
            }
            let bytes = std::mem::take(&mut self.name);
            let name = self.utf8(bytes)?;
            if let Some(output) = self.output()? {
                if self.parsed.outputs.contains_key(&name) {
                    self.shape(offset, "duplicate output name");
                }
                self.parsed.outputs.insert(name, output);
            }
        }
    }

    fn output(&mut self) -> Result<Option<Output>, Corruption> {
        let offset = self.src.offset();
        if !self.enter(b'{', "an output is not an object")? {
            self.shape(offset, "an output is not an object");
            return Ok(None);
        }
        let (mut value, mut type_, mut sensitive) = (None, None, false);
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"value") {
                self.once(&mut seen, 1, offset, "value");
                value = Some(self.json_value()?);
            } else if key.is(b"type") {
                self.once(&mut seen, 2, offset, "type");
                type_ = Some(self.json_value()?);
            } else if key.is(b"sensitive") {
                self.once(&mut seen, 4, offset, "sensitive");
                match self.bool_value()? {
                    Typed::Value(flag) => sensitive = flag,
                    Typed::Null => sensitive = false,
                    Typed::Mismatch => self.shape(offset, "an output's sensitive is not a boolean"),
                }
            } else {
                self.skip_value()?;
            }
        }
        let (Some(value), Some(type_)) = (value, type_) else {
            self.shape(offset, "an output has no value or no type");
            return Ok(None);
        };
        let value = if sensitive {
            OutputValue::Sensitive(Sensitive::new(value))
        } else {
            OutputValue::Plain(value)
        };
        Ok(Some(Output { value, type_ }))
    }

    /// Any value, kept as compact JSON text.
    fn json_value(&mut self) -> Result<Json, Corruption> {
        self.src.ws_some()?;
        self.src.start_capture();
        let skipped = self.skip_value();
        let bytes = compact(&self.src.finish_capture());
        skipped?;
        Ok(Json(self.utf8(bytes)?.into_boxed_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;

    #[test]
    fn output_values_are_compact_and_exact() {
        let parsed = parse(
            "{\"version\":4,\"outputs\":{\"o\":{\"value\" : {\n  \"a\" : [ 1 , 2.0e3 , \"x y\\n\\u00e9\" ],\n  \"b\": 123456789012345678901234567890, \"c\": null, \"d\": true\n},\n\"type\": [\"object\", {\"a\": [\"tuple\", [\"number\"]]}]}}}",
        )
        .unwrap();
        let output = &parsed.outputs["o"];
        assert_eq!(
            output.value.expose().as_str(),
            r#"{"a":[1,2.0e3,"x y\n\u00e9"],"b":123456789012345678901234567890,"c":null,"d":true}"#
        );
        assert_eq!(
            output.type_.as_str(),
            r#"["object",{"a":["tuple",["number"]]}]"#
        );
        assert_eq!(output.value.expose().to_value().unwrap()["a"][2], "x y\né");
    }

    #[test]
    fn sensitive_outputs_are_wrapped() {
        let parsed = parse(
            r#"{"version":4,"outputs":{"s":{"value":"hunter2","type":"string","sensitive":true},"p":{"sensitive":false,"value":"plain","type":"string"}}}"#,
        )
        .unwrap();
        assert!(parsed.outputs["s"].sensitive());
        assert!(!parsed.outputs["p"].sensitive());
        let debug = format!("{parsed:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("plain"), "{debug}");
    }
}
