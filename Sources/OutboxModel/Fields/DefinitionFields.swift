/// Every field of a definition file (`definitions/*.yaml`): the loader's known fields,
/// ranges and values.
package enum DefinitionFields {
    static let template = FieldType.template("text")
    static let bodyTemplate = FieldType.template("a whole value giving the list")

    package static let top = FieldMapping(
        "", "One kind of request; `key` and one of `request` or `request_command` are required.",
        [
            Field(
                "key", .string("the request kind, e.g. note.comment"), .required, example: "note.comment.add",
                "the definition's name, stored with every entry; no spaces"),
            Field(
                "request", .mapping(request), .described("required unless `request_command`"),
                example: ["method": "PUT", "url": "https://api.example.com/items/{{ vars.id }}", "data": "{{ vars.item }}"],
                "the request template, rendered once at enqueue"),
            Field(
                "response", .anyOf([.enumeration(["raw", "json"]), .mapping(response)]), .value("raw"), example: "json",
                "how the body is parsed for `on_success` (`data` in the outcome)"),
            Field(
                "accept", .list(.mapping(accept)), .value([]), example: [["status": 409, "body_includes": "already exists"]],
                "non-2xx answers that count as success"),
            Field(
                "retry", .mapping(ConfigFields.retry), .described("the config's `retry`"),
                example: ["terminal_http": ["exempt": [404, 409]]], "retry rules; replace the config's as a whole"),
            Field(
                "expires_in", .nullable(.anyOf([.duration, template])), .described("the config's `lifetime`"), example: "2h",
                "how long an entry may keep trying; past it the entry settles `error`, kind `expired`"),
            Field(
                "scope", .nullable(.template("a serial scope name")), .none, example: "note-{{ vars.note_id }}",
                "entries with the same rendered scope run one at a time, in enqueue order; one that renders empty has no scope"),
            Field(
                "on_rejected", .enumeration(["continue", "cancel-scope"]), .value("continue"), example: "cancel-scope",
                "what an entry that settles `error` does to the entries queued behind it in its scope"),
            Field("on_success", .nullable(.command), .none, example: "hooks/done.sh", "the hook for `completed` outcomes"),
            Field("on_error", .nullable(.command), .none, example: ["python3", "hooks/failed.py"], "the hook for `error` outcomes"),
            Field(
                "request_command", .nullable(.command), .none, example: "hooks/presign.sh",
                "a plugin that builds the request at enqueue instead of `request`"),
            Field(
                "then", .mapping(then), .none, example: ["on_success": [["key": "note.notify", "vars": ["note": "{{ vars.note_id }}"]]]],
                "follow-up entries enqueued with the outcome, in the same transaction"),
        ])

    package static let request = FieldMapping(
        "request", "Every string is a template; at most one body kind: `data`, `text`, `form` or `file`.",
        [
            Field(
                "method", .anyOf([.enumeration(Definition.methods), template]), .value("POST"), example: "PUT",
                "the HTTP method, any case; a `GET` cannot have a body"),
            Field(
                "url", .template("an absolute http or https URL"), .described("required unless `parts` gives the URLs"),
                example: "https://api.example.com/notes/{{ vars.note_id }}", "the URL; substitutions inside it are percent-encoded"),
            Field(
                "headers", .headers, .value([:]), example: ["Authorization": "Bearer {{ env.API_TOKEN }}"],
                "merged over the config's and `headers_command`'s headers"),
            Field("data", .any, .none, example: ["comment": "{{ vars.comment }}"], "a JSON body; `null` sends `null`"),
            Field(
                "text", .template("the body text"), .none, example: "id,name\n{{ vars.id }},{{ vars.name }}\n",
                "a text body; may use `{{ for }}` blocks"),
            Field(
                "form", .anyOf([.list(.mapping(form)), bodyTemplate]), .none, example: [["name": "note", "value": "{{ vars.note }}"]],
                "a `multipart/form-data` body"),
            Field(
                "file", .template("a file path"), .none, example: "{{ vars.path }}",
                "a whole-file body; a relative path is the `enqueue` process's folder's"),
            Field(
                "parts", .anyOf([.mapping(partsPlan), .list(.mapping(partsItem)), bodyTemplate]), .none,
                example: ["plan": ["max": "16MiB"], "url": "https://u.example.com/{{ vars.upload }}/{{ part.number }}"],
                "sends `file` as chunked parts: a plan, a list that tiles the file, or a template giving that list"),
            Field(
                "content_type", template, .described("by body kind"), example: "application/xml",
                "the body's `Content-Type`; wins over a header"),
            Field(
                "ownership", .anyOf([.enumeration(["copy", "move", "reference"]), template]),
                .described("`copy` for a whole file, `move` with parts"), example: "reference", "who owns the file after enqueue"),
            Field(
                "follow_redirects", .anyOf([.integer(0...50), template]), .value(0), example: 5,
                "redirects to follow; with 0 a 3xx settles `error`, kind `http`"),
            Field(
                "redirect_method_change", .anyOf([.bool, template]), .value(false), example: true,
                "follow a 301/302/303 of a request other than GET or HEAD as a GET without its body"),
            Field(
                "wifi_only", .nullable(.anyOf([.bool, template])), .none, example: true,
                "`true` or `false` overrides the queue's `outbox wifi-only` setting"),
            Field(
                "idempotency_key", .anyOf([.bool, template]), .described("`true`, except for GET"), example: false,
                "mint an `Idempotency-Key` at enqueue, sent with every attempt"),
            Field(
                "s3", .mapping(s3), .none,
                example: ["bucket": "{{ env.S3_BUCKET }}", "key": "captures/{{ vars.relative_path | path }}", "region": "eu-west-3"],
                "a PUT of `file` to an S3 object, signed (SigV4) when sent; no `method`, `url`, `parts` or other body"),
        ])

    static let s3 = FieldMapping(
        "request.s3", "An S3 object; every string is a template. Credentials are read by the runner at each attempt, never stored.",
        [
            Field("bucket", .template("a bucket name"), .required, example: "my-archive", "the bucket"),
            Field(
                "key", .template("an object key"), .required, example: "captures/{{ vars.relative_path | path }}",
                "the object key, taken as rendered (not percent-encoded); no `.` or `..` segments"),
            Field("region", .template("a region name"), .required, example: "eu-west-3", "the region the request is signed for"),
            Field(
                "endpoint", .template("scheme://host[:port]"), .described("`https://s3.REGION.amazonaws.com`"),
                example: "{{ env.AWS_ENDPOINT_URL | default(\"\") }}", "an S3-compatible server; an empty value means the default"),
            Field(
                "path_style", .anyOf([.bool, template]), .described("`false`, `true` when the endpoint is an IP address or localhost"),
                example: true, "`ENDPOINT/BUCKET/KEY` instead of `BUCKET.HOST/KEY`"),
            Field(
                "storage_class", .template("a storage class"), .none, example: "STANDARD_IA",
                "sent as `x-amz-storage-class`"),
            Field(
                "content_type", .template("a media type"), .value("application/octet-stream"), example: "video/mp4",
                "the object's `Content-Type`"),
            Field(
                "multipart_threshold", .anyOf([.size, template]), .value("64MiB"), example: "100MiB",
                "a bigger file is a multipart upload (5MiB to 5GiB)"),
            Field(
                "part_size", .anyOf([.size, template]), .value("16MiB"), example: "64MiB",
                "the size of a multipart upload's parts but the last (5MiB to 5GiB; grown to fit 10,000 parts)"),
            Field(
                "skip_existing", .anyOf([.bool, template]), .value(false), example: true,
                "HEAD the object first; one of the same size and SHA-256 checksum completes the entry without an upload"),
        ])

    static let response = FieldMapping(
        "response", "A parser plugin: gets `{\"vars\", \"raw\"}` on stdin and prints the data as JSON.",
        [Field("command", .command, .required, example: "hooks/parse.sh", "the parser plugin")])

    static let accept = FieldMapping(
        "accept items", "Checked before the status classes, so a rule can claim any status.",
        [
            Field("status", .integer(100...599), .required, example: 409, "the status to match"),
            Field(
                "body_includes", .string("text the body must contain"), .none, example: "already exists",
                "the body must contain these bytes, within its first `max_response_bytes`"),
        ])

    static let then = FieldMapping(
        "then", "Follow-ups of the matching list are enqueued in the transaction that journals the outcome.",
        [
            Field(
                "on_success", .list(.mapping(followUp)), .value([]), example: [["key": "note.notify"]],
                "follow-ups of a `completed` outcome"),
            Field(
                "on_error", .list(.mapping(followUp)), .value([]), example: [["key": "upload.abort", "delay": "10m"]],
                "follow-ups of an `error` outcome"),
        ])

    static let followUp = FieldMapping(
        "then items", "Each item of `then.on_success` and `then.on_error`; templates also see `outcome.*`.",
        [
            Field("key", .template("a definition key"), .required, example: "capture.complete", "the follow-up's definition"),
            Field(
                "vars", .any, .none, example: ["upload_id": "{{ vars.upload_id }}"],
                "the follow-up's vars; whole-value templates keep their type"),
            Field(
                "id", .template("an entry id"), .none, example: "complete-{{ entry.id }}",
                "the follow-up's id; a fixed id makes a replay enqueue the same entry"),
            Field("delay", .duration, .none, example: "10m", "hold the follow-up this long"),
        ])

    static let form = FieldMapping(
        "request.form items", "Each field is `{name, value}` or `{name, file}`.",
        [
            Field("name", template, .required, example: "photo", "the field's name"),
            Field("value", .any, .none, example: "{{ vars.note }}", "the value; a number, boolean, list or object is sent as JSON text"),
            Field("file", .template("a file path"), .none, example: "{{ vars.photo }}", "a file, copied into the store at enqueue"),
            Field("filename", template, .none, example: "photo.jpg", "the file name sent with a file"),
            Field("content_type", template, .none, example: "image/jpeg", "the field's `Content-Type`"),
        ])

    static let partsPlan = FieldMapping(
        "request.parts", "Parts cut by outbox; `url` and `headers` see `part.*`.",
        [
            Field(
                "plan", .mapping(plan), .value(["min": "8MiB", "max": "20MiB", "max_parts": 10000]), example: ["max": "16MiB"],
                "how the file is cut"),
            Field(
                "url", .template("an absolute http or https URL"), .required,
                example: "https://u.example.com/{{ vars.upload }}/{{ part.number }}", "each part's URL"),
            Field(
                "headers", .headers, .value([:]), example: ["Content-Range": "bytes {{ part.start }}-{{ part.last }}/{{ file.size }}"],
                "each part's headers"),
        ])

    static let plan = FieldMapping(
        "request.parts.plan", "Greedy parts of `max` bytes; `outbox chunk-plan SIZE` prints a plan.",
        [
            Field(
                "min", .anyOf([.size, template]), .value("8MiB"), example: "5MiB", "a last piece smaller than this joins the part before it"
            ),
            Field("max", .anyOf([.size, template]), .value("20MiB"), example: "64MiB", "the size of every part but the last"),
            Field(
                "max_parts", .anyOf([.integer(1...1_000_000), template]), .value(10000), example: 1000,
                "when more parts would be needed, the part size grows to size/max_parts rounded up to a whole MiB"),
        ])

    static let partsItem = FieldMapping(
        "request.parts items", "An explicit list must tile the file from byte 0, in order, without gaps or overlaps.",
        [
            Field(
                "url", .template("an absolute http or https URL"), .required, example: "https://u.example.com/a?part=1", "the part's URL"),
            Field("headers", .headers, .value([:]), example: ["Content-MD5": "{{ vars.md5 }}"], "the part's headers"),
            Field("range", .mapping(range), .required, example: ["start": 0, "end": 1_048_576], "the bytes the part sends"),
        ])

    static let range = FieldMapping(
        "request.parts items.range", "`end` is exclusive.",
        [
            Field("start", .any, .required, example: 0, "the first byte"),
            Field("end", .any, .required, example: 1_048_576, "the byte after the last"),
        ])
}
