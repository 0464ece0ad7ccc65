"""What a request's grammar or JSON schema may ask, checked before any backend sees it: GBNF
text llama.cpp's grammar code would crash on or be tied up by (gbnf_guard, gbnf_shape), and
JSON schemas made ready for both backends — closed to their listed properties, refused when no
answer can satisfy them (schema_prepare, over schema_walk, schema_closing, schema_checks).
Value-type checks like params' own: SamplingParams.validate calls them at submit."""
