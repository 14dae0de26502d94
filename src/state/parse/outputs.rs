//! The root module's outputs: each value and type kept as compact JSON
//! text, a sensitive value wrapped, and all of them within
//! [`MAX_OUTPUTS`](crate::state::MAX_OUTPUTS), counted as they are read, so
//! that the pass stops at the output that passes the cap rather than after
//! holding it.

use super::{Parser, Typed};
use crate::state::lexer::Blocks;
use crate::state::{Corruption, Json, OUTPUT_COST, Output, OutputValue, Sensitive};

impl<B: Blocks> Parser<B> {
    pub(super) fn outputs(&mut self) -> Result<(), Corruption> {
        self.parsed.outputs.clear();
        if !self.enter(b'{', "outputs is not an object")? {
            return Ok(());
        }
        let mut first = true;
        loop {
            let offset = self.src.offset();
            let Some((name, over)) = self.output_name(&mut first)? else {
                return Ok(());
            };
            if let Some(output) = self.output(&over)? {
                if self.parsed.outputs.contains_key(&name) {
                    self.shape(offset, "duplicate output name");
                }
                self.parsed.outputs.insert(name, output);
            }
        }
    }

    /// The next output's name and its colon, charged to the outputs' budget
    /// with the cost of the output, and the error that names the output when
    /// it passes the cap; None at the closing `}`.
    fn output_name(
        &mut self,
        first: &mut bool,
    ) -> Result<Option<(String, Corruption)>, Corruption> {
        if !self.before_key(first)? {
            return Ok(None);
        }
        // The name's opening quote, just consumed.
        let offset = self.src.offset().saturating_sub(1);
        let over = Corruption::OutputsTooLarge { offset };
        self.charge(OUTPUT_COST, &over)?;
        let mut name = Vec::new();
        if !self.src.read_string_within(&mut name, self.outputs_left)? {
            return Err(over);
        }
        self.charge(name.len(), &over)?;
        self.colon()?;
        Ok(Some((self.utf8(name)?, over)))
    }

    /// Takes `bytes` from what the outputs may still hold.
    fn charge(&mut self, bytes: usize, over: &Corruption) -> Result<(), Corruption> {
        match self.outputs_left.checked_sub(bytes) {
            Some(left) => {
                self.outputs_left = left;
                Ok(())
            }
            None => Err(over.clone()),
        }
    }

    fn output(&mut self, over: &Corruption) -> Result<Option<Output>, Corruption> {
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
                value = Some(self.json_value(over)?);
            } else if key.is(b"type") {
                self.once(&mut seen, 2, offset, "type");
                type_ = Some(self.json_value(over)?);
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

    /// Any value, kept as compact JSON text, copied once from the blocks as
    /// the skipper checks it, within what the outputs may still hold.
    fn json_value(&mut self, over: &Corruption) -> Result<Json, Corruption> {
        self.src.ws_some()?;
        self.src.start_capture(self.outputs_left, over.clone());
        let skipped = self.skip_value();
        // Ends the capture whatever the skip gave.
        let captured = self.src.finish_capture();
        skipped?;
        let bytes = captured?;
        self.charge(bytes.len(), over)?;
        Ok(Json(self.utf8(bytes)?.into_boxed_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use crate::state::{Corruption, MAX_OUTPUTS, OUTPUT_COST};

    /// A state whose outputs are `outputs` (name, value, type, as JSON text).
    fn state(outputs: &[(&str, &str, &str)]) -> String {
        let members: Vec<String> = outputs
            .iter()
            .map(|(name, value, type_)| {
                format!(r#""{name}": {{"value": {value}, "type": {type_}}}"#)
            })
            .collect();
        format!(
            r#"{{"version": 4, "outputs": {{{}}}, "resources": []}}"#,
            members.join(", ")
        )
    }

    /// What `outputs` are charged, their text compact as the state has it.
    fn charge(outputs: &[(&str, &str, &str)]) -> usize {
        outputs
            .iter()
            .map(|(name, value, type_)| OUTPUT_COST + name.len() + value.len() + type_.len())
            .sum()
    }

    fn refused_at(json: &str) -> u64 {
        match parse(json) {
            Err(Corruption::OutputsTooLarge { offset }) => offset,
            other => panic!("expected the outputs' cap, got {:?}", other.map(|_| ())),
        }
    }

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

    #[test]
    fn outputs_up_to_the_cap_read_whole() {
        let string = r#""string""#;
        let list = format!("[{}0]", "0,".repeat(300_000));
        let others = [
            ("b", list.as_str(), r#""dynamic""#),
            ("s", r#""hunter2""#, string),
        ];
        // "a" takes what is left of the cap exactly, in 2-byte characters.
        let room = MAX_OUTPUTS - charge(&others) - charge(&[("a", r#""""#, string)]);
        let long = format!("\"{}{}\"", "é".repeat(room / 2), "x".repeat(room % 2));
        let outputs = [("a", long.as_str(), string), others[0], others[1]];
        assert_eq!(charge(&outputs), MAX_OUTPUTS);
        // Whitespace outside strings is not kept, so it is not charged.
        let json = state(&outputs).replace(",0", ", 0").replace(
            r#""value": "hunter2""#,
            r#""sensitive": true, "value": "hunter2""#,
        );
        let parsed = parse(&json).unwrap();
        assert_eq!(parsed.outputs["a"].value.expose().as_str(), long);
        assert_eq!(parsed.outputs["a"].type_.as_str(), string);
        assert_eq!(parsed.outputs["b"].value.expose().as_str(), list);
        assert!(parsed.outputs["s"].sensitive());
        assert_eq!(parsed.outputs["s"].value.expose().as_str(), r#""hunter2""#);

        // One byte more, and the last output passes the cap.
        let longer = format!("\"x{}", &long[1..]);
        let json = state(&[("a", &longer, string), others[0], others[1]]);
        assert_eq!(refused_at(&json), json.find(r#""s""#).unwrap() as u64);
    }

    #[test]
    fn one_output_past_the_cap_is_refused_wherever_its_bytes_are() {
        let huge = "x".repeat(MAX_OUTPUTS);
        let quoted = format!("\"{huge}\"");
        let first = r#"{"version": 4, "outputs": {"#.len() as u64;
        for outputs in [
            [("o", quoted.as_str(), r#""string""#)],
            [(huge.as_str(), "1", r#""number""#)],
            [("o", "1", quoted.as_str())],
            // A value is kept as the state spells it: an escape is 6 bytes.
            [(
                "o",
                &format!("\"{}\"", r"\u0078".repeat(MAX_OUTPUTS / 6)),
                r#""string""#,
            )],
        ] {
            assert_eq!(refused_at(&state(&outputs)), first);
        }
    }

    #[test]
    fn many_tiny_outputs_are_refused_as_one_huge_one_is() {
        let names: Vec<String> = (0..MAX_OUTPUTS / OUTPUT_COST)
            .map(|i| i.to_string())
            .collect();
        let outputs: Vec<(&str, &str, &str)> =
            names.iter().map(|n| (n.as_str(), "0", "0")).collect();
        assert!(charge(&outputs) > MAX_OUTPUTS);
        refused_at(&state(&outputs));
        let parsed = parse(&state(&outputs[..1000])).unwrap();
        assert_eq!(parsed.outputs.len(), 1000);
    }
}
