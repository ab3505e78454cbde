// The HA run's config files (tools/ha/patroni.yml, haproxy.cfg) are the tested configs as they are,
// with a `{{NAME}}` for each value a run picks: ports, folders, passwords.

/** Replaces each `{{NAME}}` of a template; one without a value is an error. */
export function fillTemplate(text: string, values: Record<string, string | number>): string {
  return text.replace(/\{\{([A-Z0-9_]+)\}\}/g, (whole, name: string) => {
    const v = values[name];
    if (v === undefined) throw new Error(`no value for ${whole}`);
    return String(v);
  });
}
