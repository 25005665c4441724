// valetkey console: progressive enhancement only; every page works without this file.
'use strict';

function liveAudit(body) {
  if (!window.EventSource) return;
  const state = document.getElementById('live-state');
  const source = new EventSource(body.dataset.stream);
  source.onopen = () => { if (state) state.textContent = '(live)'; };
  source.onerror = () => { if (state) state.textContent = '(reconnecting…)'; };
  source.onmessage = (event) => {
    const row = JSON.parse(event.data);
    const tr = document.createElement('tr');
    for (const [key, value] of [['time', row.time], ['kind', row.kind], ['run', row.run], ['what', row.what]]) {
      const td = document.createElement('td');
      if (key === 'run') {
        const code = document.createElement('code');
        code.textContent = value;
        td.appendChild(code);
      } else {
        td.textContent = value;
      }
      tr.appendChild(td);
    }
    body.prepend(tr);
    while (body.rows.length > 200) body.deleteRow(-1);
  };
}

function refreshApprovals(box) {
  setInterval(async () => {
    // never replace a form someone is typing into
    if (box.contains(document.activeElement) && document.activeElement.tagName === 'INPUT') return;
    try {
      const answer = await fetch(box.dataset.refresh, {credentials: 'same-origin', cache: 'no-store'});
      if (!answer.ok) return;
      const fresh = new DOMParser().parseFromString(await answer.text(), 'text/html');
      box.replaceChildren(...fresh.body.childNodes);
    } catch (e) { /* the next tick tries again */ }
  }, 1500);
}

document.addEventListener('DOMContentLoaded', () => {
  const audit = document.getElementById('audit-live');
  if (audit) liveAudit(audit);
  const approvals = document.getElementById('approvals');
  if (approvals && approvals.dataset.refresh) refreshApprovals(approvals);
});
