// Turns schema-validation issues into one line each: where, what was expected, what came.
import type { z } from 'zod';

export function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'nothing';
  if (ArrayBuffer.isView(value)) return `${value.constructor.name}(${(value as Uint8Array).length})`;
  if (Array.isArray(value)) return `an array of ${value.length}`;
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${String(value)}`;
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v: unknown = root;
  for (const key of path) {
    if (v === null || typeof v !== 'object') return undefined;
    v = (v as Record<PropertyKey, unknown>)[key];
  }
  return v;
}

export function pathString(path: readonly PropertyKey[]): string {
  if (path.length === 0) return '(top level)';
  return path.map((k, i) => (typeof k === 'number' ? `[${k}]` : i === 0 ? String(k) : `.${String(k)}`)).join('');
}

/**
 * One line per issue, e.g. `rl.epochs: expected number, received string (got "two")`.
 * `expectedKeys` names the keys allowed at a path, to hint at a typo behind an unknown key.
 */
export function formatIssues(issues: readonly z.core.$ZodIssue[], input: unknown, expectedKeys?: (path: readonly PropertyKey[]) => string[] | undefined): string[] {
  return issues.map((issue) => {
    if (issue.code === 'unrecognized_keys') {
      // The keys allowed there, once for all the unknown ones.
      const known = expectedKeys?.(issue.path);
      const keys = shortList(issue.keys.map((k) => pathString([...issue.path, k])));
      return `${keys.join(', ')}: unknown key${issue.keys.length > 1 ? 's' : ''}${known?.length ? ` (expected one of: ${known.join(', ')})` : ''}`;
    }
    const got = describeValue(valueAt(input, issue.path));
    return `${pathString(issue.path)}: ${issue.message.replace(/^Invalid input: /, '')} (got ${got})`;
  });
}

/** At most `max` items, the rest counted: errors stay short however much is wrong. */
export function shortList(items: readonly string[], max = 5): string[] {
  return items.length <= max ? [...items] : [...items.slice(0, max), `… and ${items.length - max} more`];
}
