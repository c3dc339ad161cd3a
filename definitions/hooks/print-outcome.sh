#!/bin/sh
# Prints what outbox delivered. Exit 0 acknowledges the outcome; any other exit redelivers.
payload=$(cat)
status=$(printf '%s' "$payload" | sed -n 's/.*"status":\([0-9]*\).*/\1/p' | head -n 1)
kind=$(printf '%s' "$payload" | sed -n 's/.*"kind":"\([a-z]*\)".*/\1/p' | head -n 1)
printf '[hook] %-9s %-18s id=%s status=%s%s delivery=%s\n' "$OUTBOX_OUTCOME" "$OUTBOX_KEY" "$OUTBOX_ID" \
  "${status:-none}" "${kind:+ kind=$kind}" "$OUTBOX_DELIVERIES" >&2
exit 0
