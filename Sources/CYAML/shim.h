#ifndef CYAML_SHIM_H
#define CYAML_SHIM_H

#include <yaml.h>

/// Event kinds as plain ints: Swift compares imported C enums through a slow generic
/// path in debug builds, and this runs once per event.
enum {
    CYAML_OTHER = 0,
    CYAML_STREAM_END = 1,
    CYAML_DOCUMENT_START = 2,
    CYAML_ALIAS = 3,
    CYAML_SCALAR = 4,
    CYAML_SEQUENCE_START = 5,
    CYAML_SEQUENCE_END = 6,
    CYAML_MAPPING_START = 7,
    CYAML_MAPPING_END = 8,
};

/// Scalar styles, for the same reason.
enum {
    CYAML_PLAIN = 0,
    CYAML_SINGLE_QUOTED = 1,
    CYAML_DOUBLE_QUOTED = 2,
    CYAML_LITERAL = 3,
    CYAML_FOLDED = 4,
};

static inline long cyaml_scalar_style(yaml_scalar_style_t style) {
    switch (style) {
    case YAML_SINGLE_QUOTED_SCALAR_STYLE: return CYAML_SINGLE_QUOTED;
    case YAML_DOUBLE_QUOTED_SCALAR_STYLE: return CYAML_DOUBLE_QUOTED;
    case YAML_LITERAL_SCALAR_STYLE: return CYAML_LITERAL;
    case YAML_FOLDED_SCALAR_STYLE: return CYAML_FOLDED;
    default: return CYAML_PLAIN;
    }
}

/// The fields of one libyaml event, flattened out of the event's union so Swift reads
/// them with one call instead of walking anonymous C structs.
typedef struct {
    /// One of the CYAML_* kinds above.
    long kind;
    /// NUL-terminated, or NULL when absent.
    const unsigned char *anchor;
    /// NUL-terminated, or NULL when absent (already resolved, e.g. "tag:yaml.org,2002:str").
    const unsigned char *tag;
    /// Scalar bytes (may contain NUL), `length` long; NULL for non-scalars.
    const unsigned char *value;
    size_t length;
    /// Scalars: a CYAML_* style; collections: 1 when written in flow style, else 0.
    long style;
    /// 0-based start mark.
    size_t line;
    size_t column;
} cyaml_event_info;

static inline cyaml_event_info cyaml_event_info_of(const yaml_event_t *event) {
    cyaml_event_info info = {0};
    info.line = event->start_mark.line;
    info.column = event->start_mark.column;
    switch (event->type) {
    case YAML_STREAM_END_EVENT:
        info.kind = CYAML_STREAM_END;
        break;
    case YAML_DOCUMENT_START_EVENT:
        info.kind = CYAML_DOCUMENT_START;
        break;
    case YAML_SEQUENCE_END_EVENT:
        info.kind = CYAML_SEQUENCE_END;
        break;
    case YAML_MAPPING_END_EVENT:
        info.kind = CYAML_MAPPING_END;
        break;
    case YAML_ALIAS_EVENT:
        info.kind = CYAML_ALIAS;
        info.anchor = event->data.alias.anchor;
        break;
    case YAML_SCALAR_EVENT:
        info.kind = CYAML_SCALAR;
        info.anchor = event->data.scalar.anchor;
        info.tag = event->data.scalar.tag;
        info.value = event->data.scalar.value;
        info.length = event->data.scalar.length;
        info.style = cyaml_scalar_style(event->data.scalar.style);
        break;
    case YAML_SEQUENCE_START_EVENT:
        info.kind = CYAML_SEQUENCE_START;
        info.anchor = event->data.sequence_start.anchor;
        info.tag = event->data.sequence_start.tag;
        info.style = event->data.sequence_start.style == YAML_FLOW_SEQUENCE_STYLE;
        break;
    case YAML_MAPPING_START_EVENT:
        info.kind = CYAML_MAPPING_START;
        info.anchor = event->data.mapping_start.anchor;
        info.tag = event->data.mapping_start.tag;
        info.style = event->data.mapping_start.style == YAML_FLOW_MAPPING_STYLE;
        break;
    default:
        break;
    }
    return info;
}

#endif
