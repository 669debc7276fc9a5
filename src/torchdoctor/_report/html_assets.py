"""The device map's stylesheet and script (pure data: inlined into every map so it works from ``file://``).

Every rule is written under ``.tdmap``; :func:`torchdoctor._report.html.render_html` rewrites that prefix to the
map's own ``#tdm-…`` id, so the rules outrank any class-based rule of the page around a map (JupyterLab's
``.jp-RenderedHTMLCommon td`` is two classes and an element; VS Code's notebook output styles bare ``table``,
``tr``, ``td``). The host sets what the map leaves unset (table-layout, text-align, white-space, padding, margins,
``code`` backgrounds), so the map sets every property of tables, cells, headings and code that its layout relies
on, instead of inheriting whatever the notebook decided. VS Code removes every table border with
``!important``; the totals grid keeps its lines with ``!important`` of its own (the id outranks the bare
element). The script never builds HTML from data: every name, path and message reaches the page through
``textContent`` or ``setAttribute``.
"""

CSS = r"""
.tdmap{font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;background:#fff;
  max-width:1200px;margin:0 auto;padding:8px 16px;text-align:left;box-sizing:border-box;white-space:normal}
.tdmap h1,.tdmap h2{font-family:inherit;font-weight:600;line-height:1.3;color:inherit;border:0;padding:0;
  text-align:left}
.tdmap h1{font-size:18px;margin:6px 0}.tdmap h2{font-size:15px;margin:14px 0 6px}
.tdmap p{margin:4px 0;text-align:left}
.tdmap code,.tdmap pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;color:inherit;
  background:none;border:0;padding:0;border-radius:0}
.tdmap ul{margin:2px 0;padding-left:20px}
.tdmap table{border-collapse:collapse;border-spacing:0;table-layout:auto;margin:0;border:0;font-size:inherit;
  color:inherit;max-width:none;width:auto}
.tdmap tr{background:transparent;border:0}
.tdmap td,.tdmap th{vertical-align:middle;line-height:1.45;max-width:none;min-width:0;background:transparent;
  white-space:nowrap;font-size:inherit}
.tdmap .meta{color:#556;margin-bottom:6px}.tdmap .ok{color:#1b7a33;font-weight:600}
.tdmap .bad-count{color:#b3261e;font-weight:600}
.tdmap .sw{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin-right:3px;
  border:1px solid rgba(0,0,0,.25)}
.tdmap .legend span.item{margin-right:12px;white-space:nowrap}
.tdmap table.totals td,.tdmap table.totals th{border:1px solid #dde !important;padding:2px 8px;text-align:right}
.tdmap table.totals th{background:#f4f5f8;font-weight:600}
.tdmap .outline-box{overflow-x:auto}
.tdmap table.outline{width:100%}
.tdmap table.outline td{padding:1px 6px;text-align:left;border:0}
.tdmap table.outline td.num{text-align:right;color:#445}.tdmap table.outline td.barcell{width:35%}
.tdmap table.outline tr:hover{background:#f3f4f8}
.tdmap table.outline .size{display:block;height:9px;background:#7b8fb3;border-radius:2px}
.tdmap .cards{display:flex;flex-direction:column;gap:8px}
.tdmap ul.missed{list-style:none;margin:4px 0;padding:0;text-align:left}.tdmap ul.missed li{margin:1px 0}
.tdmap .card{border:1px solid #e3b4b0;border-left:5px solid #b3261e;background:#fff7f6;padding:6px 10px;border-radius:4px}
.tdmap .card .kind{font-weight:700;color:#b3261e;margin-right:6px}
.tdmap .card.move{border-color:#c9cfdb;border-left-color:#5b6b86;background:#f6f8fb}.tdmap .card.move .kind{color:#3d4a60}
.tdmap .card dl{display:grid;grid-template-columns:max-content 1fr;gap:1px 10px;margin:4px 0}
.tdmap .card dt{color:#667;font-weight:400}.tdmap .card dd{margin:0;overflow-wrap:anywhere}
.tdmap details.rest>summary{cursor:pointer;color:#445;margin:4px 0}
.tdmap .fix{position:relative}.tdmap .fix pre{background:#1e2430;color:#e8ecf3;padding:6px 8px;border-radius:4px;
  overflow-x:auto;margin:4px 0;white-space:pre}
.tdmap button{font:12px system-ui,sans-serif;cursor:pointer;border:1px solid #bbc;background:#f4f5f8;border-radius:3px}
.tdmap .fix .copy{position:absolute;right:4px;top:4px}
.tdmap details.members ul{max-height:180px;overflow:auto}
.tdmap .searchbar{display:flex;gap:8px;align-items:center;margin:6px 0}
.tdmap .searchbar input{flex:1;padding:4px 6px;font-size:13px}
.tdmap .hits{max-height:220px;overflow:auto;border:1px solid #eee}.tdmap .hits:empty{display:none}
.tdmap .hits div{cursor:pointer;padding:1px 6px;font:12px ui-monospace,monospace}.tdmap .hits div:hover{background:#eef}
.tdmap .tree{font:12px/1.6 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.tdmap .tree .kids{margin-left:16px;border-left:1px dotted #ccd;padding-left:4px}
.tdmap .tree .row{white-space:nowrap;padding:0 4px;border-radius:3px}
.tdmap .tree .row:hover{background:#f3f4f8}
.tdmap .tree .row.bad{background:#fde8e6;outline:1px solid #e9a39d}
.tdmap .tree .row.hit{animation:tdflash 1.6s ease-out;outline:2px solid #3b6fd8}
@keyframes tdflash{from{background:#fff3a0}to{background:transparent}}
.tdmap .tree .tw{display:inline-block;width:14px;cursor:pointer;color:#667;user-select:none}
.tdmap .tree .nm{font-weight:600}.tdmap .tree .info{color:#667;margin-left:8px}
.tdmap .tree .pb{color:#fff;background:#b3261e;border-radius:8px;padding:0 6px;margin-left:8px;font-size:11px}
.tdmap .bar{display:inline-flex;width:90px;height:8px;margin-left:8px;vertical-align:0;border:1px solid #ccd}
.tdmap .bar span{display:block;height:100%}
.tdmap .more{margin:2px 0 2px 16px}.tdmap .note{color:#667;font-style:italic}
"""

JS = r"""
(function(){
"use strict";
var root=document.getElementById(ROOT_ID); if(!root) return;
var D=JSON.parse(root.querySelector('script.td-data').textContent);
var CHUNK=400, devC=D.colors.device, dtC=D.colors.dtype;
function el(tag,cls,text){var e=document.createElement(tag); if(cls) e.className=cls; if(text!=null) e.textContent=text; return e;}
function human(n){var u=["B","KiB","MiB","GiB","TiB"],i=0; while(n>=1024&&i<4){n/=1024;i++;} return i?n.toFixed(1)+" "+u[i]:n+" B";}
function Node(name,full,parent){this.name=name;this.full=full;this.parent=parent;this.kids=[];this.byName=new Map();
  this.t=null;this.dev=new Map();this.dt=new Map();this.np=0;this.el=null;this.kidsEl=null;this.open=false;this.shown=0;}
var top=new Node("","",null), byPath=new Map(), paths=[], lastHit=null;
function child(n,name){var c=n.byName.get(name); if(!c){c=new Node(name,n.full?n.full+"."+name:name,n);
  n.byName.set(name,c); n.kids.push(c); byPath.set(c.full,c); paths.push(c.full);} return c;}
function add(m,k,v){m.set(k,(m.get(k)||0)+v);}
function nodeFor(path){var parts=path.split("."), n=top; for(var i=0;i<parts.length;i++) n=child(n,parts[i]); return n;}
D.tensors.forEach(function(r){  // [path, device, dtype, role, shape, nbytes, alias_of, found->to text]
  var n=nodeFor(r[0]); n.t=r; if(r[6]) return;
  var dev=D.devices[r[1]], dt=D.dtypes[r[2]];
  for(var a=n;a;a=a.parent){add(a.dev,dev,r[5]||1); add(a.dt,dt,r[5]||1);} });
D.problems.forEach(function(p){ var n=byPath.get(p.path)||nodeFor(p.path);
  n.bad=(n.bad||[]).concat([p]); for(var a=n;a;a=a.parent) a.np++; });
function dominant(m){var best=null,bv=-1; m.forEach(function(v,k){if(v>bv){bv=v;best=k;}}); return best;}
function swatch(kind,name,mix){var s=el("span","sw "+kind), C=kind==="dev"?devC:dtC, c=C[name];
  if(name==="mixed"&&mix){var stops=[],i=0,n=mix.size; mix.forEach(function(v,k){  // one stripe per member
      stops.push((C[k]||"#999")+" "+(100*i/n)+"% "+(100*(i+1)/n)+"%"); i++;});
    s.style.background="linear-gradient(90deg,"+stops.join(",")+")";
    s.setAttribute("title",(kind==="dev"?"devices ":"dtypes ")+Array.from(mix.keys()).join(", ")); return s;}
  if(c) s.style.backgroundColor=c; s.setAttribute("title",(kind==="dev"?"device ":"dtype ")+name); return s;}
function bar(n){var b=el("span","bar"), total=0; n.dev.forEach(function(v){total+=v;});
  n.dev.forEach(function(v,k){var s=el("span"); s.style.width=(100*v/total)+"%"; s.style.backgroundColor=devC[k]||"#999";
    s.setAttribute("title",k+": "+human(v)); b.appendChild(s);}); return b;}
function render(n){
  var box=el("div","node"), row=el("div","row"); box.appendChild(row); n.el=box;
  row.setAttribute("data-path",n.full);
  var tw=el("span","tw",n.kids.length?"\u25b8":"\u00a0"); row.appendChild(tw);
  var dev=n.t&&!n.t[6]?D.devices[n.t[1]]:(n.dev.size>1?"mixed":dominant(n.dev));
  var dt=n.t&&!n.t[6]?D.dtypes[n.t[2]]:(n.dt.size>1?"mixed":dominant(n.dt));
  if(dev){row.setAttribute("data-device",dev); row.appendChild(swatch("dev",dev,n.dev));}
  if(dt){row.setAttribute("data-dtype",dt); row.appendChild(swatch("dt",dt,n.dt));}
  row.appendChild(el("span","nm",n.name));
  if(n.t){var r=n.t; var txt=r[6]?"alias of "+r[6]:(r[7]||(D.dtypes[r[2]]+"["+r[4].join(",")+"] @ "+D.devices[r[1]]))+
      " \u00b7 "+D.roles[r[3]]+" \u00b7 "+human(r[5]); row.appendChild(el("span","info",txt));}
  if(n.kids.length&&n.dev.size) row.appendChild(bar(n));
  if(n.kids.length) row.appendChild(el("span","info",n.kids.length+" children"));
  if(n.bad){row.classList.add("bad"); row.setAttribute("data-problem",n.bad.map(function(p){return p.kind;}).join(" "));
    row.setAttribute("title",n.bad.map(function(p){return p.kind+": "+p.message;}).join("\n"));}
  if(n.np) row.appendChild(el("span","pb",n.np+(n.np>1?" problems":" problem")));
  if(n.kids.length){tw.addEventListener("click",function(){toggle(n);}); row.addEventListener("dblclick",function(){toggle(n);});}
  return box;}
function more(n){ var end=Math.min(n.kids.length,n.shown+CHUNK);
  for(var i=n.shown;i<end;i++) n.kidsEl.appendChild(render(n.kids[i])); n.shown=end;
  var old=n.kidsEl.querySelector(":scope > .more"); if(old) old.remove();
  if(n.shown<n.kids.length){var b=el("button","more","show "+Math.min(CHUNK,n.kids.length-n.shown)+" more of "+
    (n.kids.length-n.shown)); b.addEventListener("click",function(){more(n);}); n.kidsEl.appendChild(b);} }
function expand(n){ if(n===top||n.open||!n.kids.length) return; n.open=true;
  if(!n.kidsEl){n.kidsEl=el("div","kids"); n.el.appendChild(n.kidsEl); more(n);} n.kidsEl.hidden=false;
  n.el.firstChild.firstChild.textContent="\u25be"; n.el.classList.add("open");}
function collapse(n){ if(!n.open) return; n.open=false; n.kidsEl.hidden=true; n.el.firstChild.firstChild.textContent="\u25b8";
  n.el.classList.remove("open");}
function toggle(n){ if(n.open) collapse(n); else expand(n); }
var tree=root.querySelector(".tree");
top.kidsEl=tree; more(top);
for(var n=top; n.kids.length===1; n=n.kids[0]) expand(n.kids[0]);  // a lone root ("model") opens by itself
function reveal(path){ var n=byPath.get(path); if(!n) return false; var chain=[];
  for(var a=n;a&&a!==top;a=a.parent) chain.unshift(a);
  chain.forEach(function(a){ var p=a.parent; while(!a.el&&p.shown<p.kids.length) more(p); if(a!==n) expand(a); });
  var row=n.el.firstChild; if(lastHit) lastHit.classList.remove("hit"); void row.offsetWidth; row.classList.add("hit");
  lastHit=row;
  row.scrollIntoView({block:"center"}); return true;}
root.revealPath=reveal;
var q=root.querySelector("input.q"), hits=root.querySelector(".hits"), count=root.querySelector(".hitcount"), timer=null;
function search(){ var s=q.value.trim().toLowerCase(); hits.textContent=""; if(!s){count.textContent=""; return;}
  var found=0; for(var i=0;i<paths.length;i++){ if(paths[i].toLowerCase().indexOf(s)<0) continue; found++;
    if(found<=200){ var h=el("div","hit",paths[i]); h.setAttribute("data-path",paths[i]);
      h.addEventListener("click",function(){reveal(this.getAttribute("data-path"));}); hits.appendChild(h);} }
  count.textContent=found+(found===1?" match":" matches")+(found>200?" (first 200 shown)":"");}
q.addEventListener("input",function(){clearTimeout(timer); timer=setTimeout(search,120);});
q.addEventListener("keydown",function(e){ if(e.key==="Enter"){clearTimeout(timer); search();
  var f=hits.firstChild; if(f) reveal(f.getAttribute("data-path"));} });
root.querySelectorAll("button.goto").forEach(function(b){ b.addEventListener("click",function(){
  reveal(b.getAttribute("data-path")); }); });
root.querySelectorAll("button.copy").forEach(function(b){ b.addEventListener("click",function(){
  var code=b.parentNode.querySelector("code").textContent;
  function fallback(){ var ta=el("textarea"); ta.value=code; ta.style.position="fixed"; ta.style.opacity="0";
    document.body.appendChild(ta); ta.select(); var ok=false; try{ok=document.execCommand("copy");}catch(e){}
    ta.remove(); b.textContent=ok?"copied":"select and copy"; }
  if(navigator.clipboard&&navigator.clipboard.writeText){ navigator.clipboard.writeText(code).then(
    function(){b.textContent="copied";},fallback);} else fallback(); }); });
root.setAttribute("data-ready","1");
})();
"""
